"""Multi-turn, tool-using rollouts of the token families: one trajectory = one token sequence.

A token policy (:class:`~mmgrpo.modalities.vlm.adapter.VLMAdapter` and the video adapter built on it) built with
``rollout.tools`` (or ``rollout.environment``) holds a :class:`TurnRunner` as its rollout driver, which reads it only
through the public sampling protocol (:class:`.sampler.TokenSampler`), and samples each of its B = P·G trajectories
as a conversation:

1. **turn 0** through the adapter's own sampler: the P prompts are prefilled once and their KV cache expanded G
   ways (:mod:`.prefix_sharing`), exactly as a single-turn rollout (under keyed noise the first turn draws the
   same tokens as a single-turn rollout of the same step);
2. each finished turn is decoded and parsed for tool calls in the chat template's format (Qwen / Hermes
   ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, :func:`mmgrpo.tools.parse_tool_calls`); the calls
   are run bounded by :func:`mmgrpo.tools.run_tool_calls` (only the configured tools; a malformed, unknown or
   hostile call is answered by an error observation, never an exception);
3. the observations are appended as the template's **tool message** (text, images, video frames as images),
   rendered as the suffix a conversation gains from those messages plus the next generation prompt (TRL's
   ``_get_tool_suffix_ids`` in ``trl/trainer/grpo_trainer.py``, verl-0.10's ``ContinuousTokenBuilder
   .merge_non_assistant_tokens``), its images expanded to image pads by the processor;
4. turns k ≥ 1 re-encode each still-running trajectory ([prompt ; trajectory so far], all its images) and sample
   one continuation per trajectory through the same decode loop (:mod:`.decode`). What is shared: the prompt's
   processor encoding and turn 0's prefill; what is not: later turns prefill each trajectory again (vision tower
   included), as verl's agent loop does per request (``verl/experimental/agent_loop/tool_agent_loop.py``);
5. a trajectory ends at a turn without a tool call (its answer), at ``rollout.max_turns`` assistant turns (a call in
   the last turn is not run), at a turn cut by ``max_new_tokens`` without its end token, or when the next
   observation and one more token would not fit ``rollout.max_total_tokens`` (that observation is dropped: TRL's
   roll-back of the tool messages that overflow ``max_completion_length``).

Layout (verl's ``gen | tool | gen | pad`` with response mask ``1 | 0 | 1 | 0``, ``generate_sequences``'s docstring):
``completion_ids [B, T]`` after the shared prompt holds every assistant and observation token, T =
``rollout.max_total_tokens``; ``mask`` (the rollout's) is 1 on the policy's own tokens — each turn up to and including
its end token — and 0 on observation tokens and padding, so observation tokens get no loss, no KL and log-prob 0.
``turn_of_token [B, T]`` numbers the action tokens by turn (−1 elsewhere), for per-turn credit
(:mod:`mmgrpo.credit`).

Log-probs (:func:`trajectory_logits`) score the policy's tokens given everything before them, images included: the
naive forward over [prompt ; trajectory] with the prompt's and every observation's images, mRoPE positions computed
by the model over the whole sequence (``get_rope_index`` from the ids and ``mm_token_type_ids``, as DeepEyes'
``agent_rollout_loop`` and verl's ``_compute_position_ids`` recompute them over the final sequence). A minibatch
whose trajectories carry no observation media takes the prompt-sharing forward (each prompt encoded once, the
trajectory continuing it with 1-D text positions); with observation images it falls back to the naive forward (the
one-time warning of :func:`.prefix_sharing.warn_fallback_once`).

Chat template. Qwen2.5-VL's stock template has no tool role (TRL's ``trl/chat_templates/README.md``: "Does not
support tool calling"). :data:`QWEN25_VL_TOOL_TEMPLATE` is ours: Qwen2.5-VL's media parts with the tool section of
Qwen2.5-Instruct's template — the schemas as JSON lines inside ``<tools></tools>`` in the system message, calls as
``<tool_call>`` JSON, and tool messages rendered as a **user** turn ``<tool_response>\\n…\\n</tool_response>``
(consecutive tool messages share one user turn), which is also how DeepEyes renders the zoomed image
(``Visual-Agent/DeepEyes`` ``verl/workers/agent/envs/mm_process_engine/visual_toolbox_v2.py``; verl's DeepEyes recipe
``custom_chat_template``). ``rollout.chat_template: auto`` uses the model's template when it renders tool messages
(Qwen3-VL's does) and this one otherwise.

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G``, ``T`` trajectory tokens after the prompt
(``rollout.max_total_tokens``), ``S`` assistant turns (``rollout.max_turns``), ``n`` rows of a minibatch, ``V``
vocabulary, ``H`` hidden size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import Tensor

from mmgrpo import noise, on_policy, sharding
from mmgrpo.config import ConfigError, RolloutConfig, check_kwargs
from mmgrpo.media import IMAGE_PLACEHOLDER
from mmgrpo.multiturn import tool_specs
from mmgrpo.types import Rollout, Transcript

from . import prefix_sharing
from .logprobs import head_outputs_hidden
from .sampler import TokenSampler

logger = logging.getLogger(__name__)

TURN_NOISE = 0x7A12
"""Tag mixed into the seed of turns k ≥ 1 (turn 0 draws with the rollout's own keys)."""

_MEDIA = (
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'audio' or 'audio' in part or 'audio_url' in part %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
)
QWEN25_VL_TOOL_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{% if messages[0]['content'] is string %}{{ messages[0]['content'] }}"
    "{% else %}{% for part in messages[0]['content'] %}" + _MEDIA + "{% endfor %}{% endif %}"
    "{% else %}You are a helpful assistant.{% endif %}"
    "{{ '\\n\\n' }}# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and tools %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}" + _MEDIA + "{% endfor %}{% endif %}"
    "{{ '\\n' }}</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}" + _MEDIA + "{% endfor %}{% endif %}"
    "{% if message['tool_calls'] %}{% for call in message['tool_calls'] %}"
    "{% if call['function'] %}{% set call = call['function'] %}{% endif %}"
    '{{ "\\n" }}<tool_call>\n{"name": "{{ call[\'name\'] }}", "arguments": '
    "{% if call['arguments'] is string %}{{ call['arguments'] }}{% else %}{{ call['arguments'] | tojson }}{% endif %}"
    "}\n</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen2.5-VL's chat format with Qwen2.5-Instruct's tool section (module docstring); media parts as the stock
Qwen2.5-VL template renders images and videos (and Qwen2-Audio's template audio: ``Audio k: <|audio_bos|><|AUDIO|>
<|audio_eos|>``). Tool messages become a user turn ``<tool_response>…</tool_response>``."""

_FULL_TOOLS = QWEN25_VL_TOOL_TEMPLATE[
    QWEN25_VL_TOOL_TEMPLATE.index("{{ '\\n\\n' }}# Tools") : QWEN25_VL_TOOL_TEMPLATE.index("</tool_call><|im_end|>")
]
QWEN25_VL_TOOL_TEMPLATE_BRIEF = QWEN25_VL_TOOL_TEMPLATE.replace(
    _FULL_TOOLS,
    "{{ '\\n' }}# Tools: {% for tool in tools %}{{ tool['function']['name'] }}("
    "{{ tool['function']['parameters']['required'] | join(', ') }}){% if not loop.last %}, {% endif %}{% endfor %}"
    '. Call one as <tool_call>{"name": ..., "arguments": {...}}',
)
""":data:`QWEN25_VL_TOOL_TEMPLATE` with a one-line tool section (``# Tools: crop(bbox_2d). Call one as <tool_call>…``)
instead of the JSON schemas: calls, responses and turns render exactly as there. For small models trained from
scratch on CPU (configs/zoom_tools.yaml, configs/video_tools.yaml), where the full section is most of every prompt
(~500 of the tiny tokenizer's tokens)."""

TEMPLATES = {"qwen2.5_vl_tools": QWEN25_VL_TOOL_TEMPLATE, "qwen2.5_vl_tools_brief": QWEN25_VL_TOOL_TEMPLATE_BRIEF}
"""Shipped tool-capable templates by ``rollout.chat_template`` name."""


def resolve_template(choice: str, model_template: str | None, qwen_style: bool) -> str | None:
    """The chat template of tool-using rollouts: ``None`` = the model's own (``model``, or ``auto`` when it renders
    tool messages), a shipped one by name, or the text of a Jinja file. ``qwen_style``: the model's own template
    renders Qwen's turns and media placeholders (``auto`` may then use :data:`QWEN25_VL_TOOL_TEMPLATE`)."""
    if choice == "model" or (choice == "auto" and model_template and "'tool'" in model_template.replace('"', "'")):
        return None
    if choice == "auto":
        if not qwen_style:
            raise ConfigError(
                "rollout.chat_template: auto: the model's chat template has no tool role and does not render Qwen's "
                "turns and media placeholders (<|im_start|>, <|vision_start|><|image_pad|><|vision_end|>), so no "
                "shipped template fits; give a Jinja file that renders 'tool' messages (rollout.chat_template: "
                "path/to/template.jinja)"
            )
        return QWEN25_VL_TOOL_TEMPLATE
    if choice in TEMPLATES:
        return TEMPLATES[choice]
    path = Path(choice)
    if not path.is_file():
        raise ConfigError(
            f"rollout.chat_template: {choice!r} is neither auto | model | {' | '.join(TEMPLATES)} nor a Jinja file"
        )
    return path.read_text()


# ------------------------------------------------------------------------------------------------ state


@dataclass
class TurnState:
    """Adapter-private state of multi-turn trajectories (see the module docstring for the layout).

    Shape:
        completion_ids: [B, T] assistant and observation tokens after the prompt, pad after the end
        action: [B, T] 1 = sampled by the policy (each turn up to and including its end token), 0 = observation/pad
        valid: [B, T] 1 = a trajectory token (action or observation), 0 = padding
        turn_of_token: [B, T] long, the assistant turn of each action token, −1 elsewhere
        prompt_of: [B] the prompt (of ``encodings``) each trajectory continues
    """

    completion_ids: Tensor  # [B, T]
    action: Tensor  # [B, T]
    valid: Tensor  # [B, T]
    turn_of_token: Tensor  # [B, T]
    prompt_of: Tensor  # [B]
    encodings: list[dict[str, Tensor]]
    """The P prompts' processor outputs, each with input_ids [1, Lp_i] and media tensors (shared by their G samples)."""
    media: list[dict[str, Tensor]]
    """Per trajectory, the processor tensors of its observation images (``pixel_values``, ``image_grid_thw``), in
    insertion order; an empty dict when it has none."""


@dataclass
class _Trajectory:
    """One trajectory while it is being sampled (Python lists; packed into :class:`TurnState` at the end)."""

    ids: list[int] = field(default_factory=list)
    action: list[int] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    media: list[dict[str, Tensor]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turn_invalid: list[bool] = field(default_factory=list)
    anchors: list[Any] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    shown: list[Image.Image] = field(default_factory=list)  # the observation images inserted, in order
    gt_logprobs: list[float] = field(default_factory=list)  # before each turn (rollout.ground_truth_probe)
    observations: list[Any] = field(default_factory=list)
    transcript: list[dict] = field(default_factory=list)  # every message in order (Transcript.messages)
    tool_calls: int = 0
    tool_errors: int = 0
    env_errors: int | None = None  # environment faults (0 or 1: one ends the trajectory); None: no environment
    images: int = 0
    done: bool = False
    truncated: bool = False
    cut: bool = False  # the last turn ended without its end token (not answered)

    def extend(self, ids: list[int], action: bool, turn: int) -> None:
        self.ids += ids
        self.action += [int(action)] * len(ids)
        self.turn += [turn if action else -1] * len(ids)


IMAGE_KEYS = ("pixel_values", "image_grid_thw")
"""Processor outputs of images, one block per image (concatenated along dim 0 across images)."""


def stacked_media(blocks: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The image tensors of ``blocks`` (one per observation with images) concatenated in order; ``{}`` for none."""
    return {k: torch.cat([m[k] for m in blocks]) for k in IMAGE_KEYS if any(k in m for m in blocks)}


def merge_media(encoding: dict[str, Tensor], media: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """``encoding`` (one prompt's processor outputs) with the image tensors of ``media`` appended after its own, in
    the order their image pads follow in the sequence."""
    out = dict(encoding)
    for block in media:
        for key in IMAGE_KEYS:
            if key in block:
                out[key] = torch.cat([out[key], block[key]]) if key in out else block[key]
    return out


# ---------------------------------------------------------------------------------------------- rollout


class TurnRunner:
    """Samples multi-turn trajectories for a token adapter (see the module docstring): tools (``rollout.tools``)
    answer each turn's calls, or an environment (``rollout.environment``) answers each turn's action.

    The multi-turn rollout driver (:class:`~.sampler.RolloutDriver`): the adapter is built with it when its config
    has tools or an environment and hands it ``rollout`` / ``evaluate`` / ``supervised_loss``. It reads the adapter
    only through :class:`~.sampler.TokenSampler`."""

    def __init__(self, adapter: TokenSampler, settings: RolloutConfig):
        from mmgrpo.tools import LIMITS, load_tools, render_tool_schemas, run_tool_call  # deferred: plug-in registry
        from mmgrpo.tools.env_guard import env_limits

        self.adapter = adapter
        self.settings = settings
        self.images_last = settings.observation_images == "after_text"
        self.tools = load_tools(tool_specs(settings.tools))
        self.schemas = render_tool_schemas(self.tools)
        self.limits = {**LIMITS, **check_kwargs(run_tool_call, settings.tool_limits, "rollout.tool_limits", skip=3)}
        self.env_limits = env_limits(self.limits)  # an environment's reset/step bounded as the tools' calls
        self._env_fault_logged = False
        tok = adapter.tokenizer
        model_template = getattr(adapter.processor, "chat_template", None) or getattr(tok, "chat_template", None)
        self.template = resolve_template(settings.chat_template, model_template, self._qwen_style(model_template))
        if adapter.args.min_new_tokens:
            raise ConfigError(
                "model.args.min_new_tokens > 0 is not supported with rollout.tools (the EOS ban would apply per turn "
                "when sampling but once per trajectory in the log-probs); set it to 0"
            )
        self.eos_text = tok.convert_ids_to_tokens(int(adapter.eos_ids[0]))
        self.image_encoder = next((e for e in adapter.encoders if e.kind == "image"), None)  # None: no images shown
        self._check_template()
        self.probe = None  # rollout.ground_truth_probe (IGPO): ℓ of the ground truth before each turn, .probe
        if settings.ground_truth_probe is not None:
            from mmgrpo.igpo import probe_options

            from .probe import GroundTruthProbe

            self.probe = GroundTruthProbe(adapter, probe_options(settings.ground_truth_probe), TurnState)

    # -------------------------------------------------------------------------------- chat rendering

    def _qwen_style(self, model_template: str | None) -> bool:
        """Whether the model's own template renders a user turn (with a part per medium the model takes) as Qwen's
        does, so that :data:`QWEN25_VL_TOOL_TEMPLATE` renders its prompts the same way (a default system message, as
        Qwen2.5-VL-Instruct's template adds, aside)."""
        if not model_template:
            return False
        a = self.adapter
        messages = [
            {"role": "user", "content": [*({"type": e.kind} for e in a.encoders), {"type": "text", "text": "x"}]}
        ]
        processor = a.processor if a.is_multimodal else a.tokenizer
        rendered = []
        for template in (None, QWEN25_VL_TOOL_TEMPLATE):
            try:
                text = processor.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True, chat_template=template
                )
            except Exception:  # a template that cannot render this message: not Qwen's
                return False
            rendered.append(text[text.rfind("<|im_start|>user") :] if "<|im_start|>user" in text else text)
        return rendered[0] == rendered[1]

    def template_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``apply_chat_template`` for prompts: the tool template (if not the model's) and the
        tools' schemas (none with an environment, whose actions are plain text)."""
        kwargs: dict[str, Any] = {"tools": self.schemas} if self.schemas else {}
        return {**kwargs, "chat_template": self.template} if self.template else kwargs

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        processor = self.adapter.processor if self.adapter.is_multimodal else self.adapter.tokenizer
        kwargs = {"chat_template": self.template} if self.template else {}
        return processor.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False, **kwargs
        )

    def observation_text(self, messages: list[dict]) -> str:
        """The text a conversation gains from ``messages`` (tool or user messages) and the next generation prompt,
        starting right after the assistant's end token (TRL's ``_get_tool_suffix_ids``: a dummy conversation
        rendered with and without them). Raises ``ConfigError`` when the template is not prefix-preserving."""
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        before = self._render(base, False)
        after = self._render(base + messages, True)
        cut = before.rfind(self.eos_text)
        if cut < 0 or not after.startswith(before[: cut + len(self.eos_text)]):
            raise ConfigError(
                f"rollout.chat_template: the template does not end an assistant turn with the end token "
                f"{self.eos_text!r} and keep it when a tool message follows, so observations cannot be appended to "
                "the sampled tokens; use rollout.chat_template: qwen2.5_vl_tools or a prefix-preserving template"
            )
        return after[cut + len(self.eos_text) :]

    def _check_template(self) -> None:
        """Fail at build time, not mid-rollout, on a template that cannot render tool messages."""
        text = self.observation_text([{"role": "tool", "content": [{"type": "text", "text": "OBSERVATION"}]}])
        if "OBSERVATION" not in text:
            raise ConfigError(
                "rollout.chat_template: the chat template drops tool messages; use rollout.chat_template: "
                "qwen2.5_vl_tools or a template that renders the 'tool' role"
            )

    def encode_observation(
        self, observations: list, traj: _Trajectory, role: str = "tool"
    ) -> tuple[list[int], dict[str, Tensor], list[dict]]:
        """Token ids (image pads expanded), image tensors and chat messages of one turn's observations (one
        ``role`` message each; frames as images with their times in the text); images past ``rollout.max_images``
        for the trajectory are left out, and the text says so."""
        images: list[Image.Image] = []
        messages = []
        for obs in observations:
            new = list(obs.images) + list(obs.frames)
            room = max(0, self.settings.max_images - traj.images - len(images))
            keep = new[:room] if self.image_encoder is not None else []
            text = obs.text
            if obs.frames:
                times = ", ".join(f"{t:.2f}s" for t in obs.frame_times)
                text = f"{text}\n(frames at {times})" if text else f"(frames at {times})"
            if len(keep) < len(new):
                why = f"rollout.max_images={self.settings.max_images}" if self.image_encoder else "the model takes none"
                text += f"\n({len(new) - len(keep)} image(s) not shown: {why})"
            parts = [{"type": "image", "image": img} for img in keep]
            parts = (
                [{"type": "text", "text": text}, *parts]
                if self.images_last
                else [*parts, {"type": "text", "text": text}]
            )
            messages.append({"role": role, "content": parts})
            images += keep
        plain = [{**m, "content": [{"type": "image"} if "image" in p else p for p in m["content"]]} for m in messages]
        text = self.observation_text(plain)
        a = self.adapter
        if images:
            kwargs = self.image_encoder.processor_kwargs(images)
            enc = dict(a.processor(text=[text], return_tensors="pt", **kwargs))
        else:
            enc = dict(a.tokenizer([text], return_tensors="pt", add_special_tokens=False))
        return enc["input_ids"][0].tolist(), {k: enc[k] for k in IMAGE_KEYS if k in enc}, messages

    # ---------------------------------------------------------------------------------------- sampling

    def context(self, row: dict) -> Any:
        """What the tools of one trajectory may read: the row's original images (and decoded video frames)."""
        from mmgrpo.tools import ToolContext

        images = []
        for encoder in self.adapter.encoders:
            if encoder.kind == "image":
                images = encoder.load(row)
        ctx = ToolContext(images=images, row=row)
        video = next((e for e in self.adapter.encoders if e.kind == "video"), None)  # the video adapter's VideoEncoder
        if video is not None and row.get("video") is not None:
            clip = video.clip(row)
            ctx.frames = [Image.fromarray(f.permute(1, 2, 0).clamp(0, 255).byte().numpy()) for f in clip.frames]
            ctx.frame_times = clip.timestamps
            ctx.video_fps, ctx.video_duration = clip.video_fps, clip.duration
            if isinstance(row["video"], (str, Path)):  # a file: select_frames decodes its span densely
                ctx.load_frames = lambda start, end, n, row=row: video.span_frames(row, start, end, n)
        return ctx

    def environments(self, prompts: list[dict], group_size: int) -> tuple[list[dict], list]:
        """With ``rollout.environment``: one environment per trajectory, reset from its row, and the prompts with the
        first observation appended (its text after the row's prompt, its images after the row's images, and with
        ``observation_images: after_text`` all of them after the text, as placeholders; the G
        trajectories of a row start from one state, so the prompt stays shared). Without: the prompts unchanged."""
        s = self.settings
        if s.environment is None:
            return prompts, [None] * (len(prompts) * group_size)
        from mmgrpo.tools import Observation
        from mmgrpo.tools.env_guard import start_episode

        envs, rows = [], []
        for row in prompts:
            first = Observation()  # no G environment of the row started: each trajectory ends after its first turn
            for _ in range(group_size):  # a build or reset that faults: that trajectory ends, counted (_respond)
                env, obs = start_episode(s.environment, s.environment_args, row, self.env_limits)
                first = obs or first
                envs.append(env)
            if not isinstance(row.get("prompt", ""), str):
                raise ConfigError(
                    "rollout.environment: the rows' prompt must be a string (the first observation is appended)"
                )
            images = [*(row.get("images") or ([row["image"]] if row.get("image") is not None else [])), *first.images]
            text = "\n".join(x for x in (row.get("prompt", ""), first.text) if x)
            if self.images_last and images:  # placeholders at the end put the images there (mmgrpo.media)
                text += IMAGE_PLACEHOLDER * (
                    len(first.images) if IMAGE_PLACEHOLDER in row.get("prompt", "") else len(images)
                )
            rows.append({**row, "prompt": text, "images": images or None, "image": None})
        return rows, envs

    def _turn_keys(self, keys: noise.NoiseKeys | None, turn: int, rows: list[int]) -> noise.NoiseKeys | None:
        """Keys of turn ``turn`` ≥ 1 for trajectories ``rows``: one generator per trajectory, seeded by (seed, turn,
        step, global prompt position, sample), so later turns stay independent of the world size too."""
        if keys is None:
            return None
        G = keys.group_size
        positions = tuple(noise.mix(keys.positions[b // G], b % G) for b in rows)
        return noise.NoiseKeys(noise.mix(keys.seed, TURN_NOISE, turn), keys.step, positions, 1)

    def _continuations(self, encodings: list[dict], trajs: list[_Trajectory], rows: list[int], G: int) -> list[dict]:
        """One encoding per trajectory of ``rows``: its prompt followed by its tokens so far, all its images."""
        out = []
        for b in rows:
            enc = merge_media(encodings[b // G], trajs[b].media)
            ids = torch.tensor([trajs[b].ids], dtype=torch.long)  # [1, t]
            enc["input_ids"] = torch.cat([enc["input_ids"], ids], dim=1)
            enc["attention_mask"] = torch.ones_like(enc["input_ids"])
            if "mm_token_type_ids" in enc:
                enc["mm_token_type_ids"] = media_token_types(self.adapter, enc["input_ids"])
            out.append(enc)
        return out

    def sample_turn(
        self, encodings: list[dict], n: int, greedy: bool, keys, rows: list[int], turn: int
    ) -> tuple[Tensor, Tensor | None]:
        """The policy's turn ``turn`` of trajectories ``rows``: ``n`` samples of each of ``encodings`` through the
        adapter's sampler (:mod:`.decode`) or its rollout engine (vLLM); token ids [len(rows), T1] (pad after the end
        token) and the log-probs they were drawn with. The one place the policy acts (the tests script it here)."""
        a = self.adapter
        if a.engine is None:
            return a.sample(encodings, n, greedy, keys)
        return a.engine_sample(self._engine_requests(encodings, rows, turn), n, keys, greedy)

    def _engine_requests(self, encodings: list[dict], rows: list[int], turn: int) -> list:
        """The engine's requests of a turn: turn 0 the prompts as text (the single-turn requests); later turns each
        trajectory token-in — its ids with one placeholder per image, video or audio clip (vLLM expands them, verl's
        ``_qwen2_5_vl_dedup_image_tokens``) and its media in order: the prompt's, then every observation's images."""
        from .engine import EnginePrompt

        a, rows_of = self.adapter, self._rows
        if turn == 0:
            return a.engine_prompts(rows_of, encodings)
        config = a.unwrapped().config  # Qwen2-Audio's audio pad too: vLLM expands each placeholder again
        pads = set(media_pad_ids(a)) | {getattr(config, "audio_token_id", getattr(config, "audio_token_index", -1))}
        pads -= {-1}
        out = []
        for enc, b in zip(encodings, rows):
            media = {e.kind: list(e.load(rows_of[b // self._G])) for e in a.encoders}
            media["image"] = media.get("image", []) + self._trajs[b].shown
            ids = enc["input_ids"][0].tolist()
            one = [x for i, x in enumerate(ids) if not (x in pads and i > 0 and ids[i - 1] == x)]
            out.append(EnginePrompt("", media, ids, prompt_ids=one))
        return out

    def _scripted(self, script: list[list[str]], rows: list[int], turn: int) -> tuple[Tensor, None]:
        """Token ids [len(rows), t] of turn ``turn`` of each row's script (its text + the end token, pad after)."""
        eos = int(self.adapter.eos_ids[0])
        seqs = [self.adapter.tokenizer.encode(script[b][turn], add_special_tokens=False) + [eos] for b in rows]
        ids = torch.full((len(rows), max(map(len, seqs))), self.adapter.pad_id, dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)] = torch.tensor(seq)
        return ids, None

    @torch.no_grad()
    def trajectories(
        self,
        prompts: list[dict],
        encodings: list[dict],
        group_size: int,
        keys,
        envs: list,
        greedy: bool = False,
        script: list[list[str]] | None = None,
        probe: list | None = None,
    ) -> tuple[TurnState, list[_Trajectory]]:
        """B = P·G trajectories of ``prompts`` (encoded: ``encodings``; ``envs``: B environments or Nones); their
        :class:`TurnState` and per-trajectory records. ``script`` (B lists of assistant turns) teacher-forces the
        policy's turns (the tools and environments still answer): a trajectory ends after its script's last turn.
        ``probe`` (P pseudo responses, :meth:`.probe.GroundTruthProbe.targets`): probe each turn's context first."""
        s, G = self.settings, group_size
        trajs, contexts = self.start(prompts, G)
        self.count_failed_starts(trajs, envs)
        active = list(range(len(trajs)))
        for turn in range(s.max_turns):
            if probe is not None:
                self.probe_turn(probe, trajs, active, turn, encodings, G)
            if script is not None:
                ids, logps = self._scripted(script, active, turn)  # [len(active), t]
            elif turn == 0:  # the P prompts prefilled once, their cache expanded G ways
                ids, logps = self.sample_turn(encodings, G, greedy, keys, active, turn)  # [B, T1] each
            else:
                batch = self._continuations(encodings, trajs, active, G)
                turn_keys = self._turn_keys(keys, turn, active)
                ids, logps = self.sample_turn(batch, 1, greedy, turn_keys, active, turn)  # [len(active), T1] each
            active = self.absorb_turn(ids, logps, trajs, active, turn, contexts, envs, encodings, G, script)
            if not active:
                break
        return self._pack(trajs, encodings, G), trajs

    def probe_turn(
        self, targets: list, trajs: list[_Trajectory], rows: list[int], turn: int, encodings: list[dict], G: int
    ) -> None:
        """Append to each trajectory of ``rows`` ℓ, the mean log-prob of its prompt's pseudo response ``targets[p]``
        given the context turn ``turn`` acts from (:mod:`.probe`); before turn 0 that is the prompt, probed once."""
        from .probe import ProbeContext

        if turn == 0:
            ell = self.probe.logprobs(encodings, [ProbeContext(p, [], {}) for p in range(len(encodings))], targets)
            values = [ell[b // G] for b in rows]
        else:
            contexts = [ProbeContext(b // G, list(trajs[b].ids), stacked_media(trajs[b].media)) for b in rows]
            values = self.probe.logprobs(encodings, contexts, [targets[b // G] for b in rows])
        for b, value in zip(rows, values):
            trajs[b].gt_logprobs.append(value)

    def start(self, prompts: list[dict], group_size: int) -> tuple[list[_Trajectory], list]:
        """B = P·G empty trajectories of ``prompts`` (group-major), each with its tool context and its first anchor
        (the prompt and its images)."""
        from mmgrpo.tools import Observation, state_anchor

        a, G = self.adapter, group_size
        if sharding.is_sharded(a.unwrapped()):  # known once accelerate has prepared the model: checked at first use
            raise ConfigError(
                "rollout.tools / rollout.environment under FSDP: processes run different numbers of turns, and every "
                "forward of sharded weights is a collective; train with DDP processes (or one process)"
            )
        B = len(prompts) * G
        trajs = [_Trajectory() for _ in range(B)]
        self._rows, self._trajs, self._G = prompts, trajs, G  # what the engine's requests are built from
        contexts = [self.context(prompts[b // G]) for b in range(B)]
        for b, t in enumerate(trajs):
            t.anchors.append(
                state_anchor(Observation(text=str(prompts[b // G].get("prompt")), images=contexts[b].images))
            )
            t.env_errors = 0 if self.settings.environment is not None else None
        return trajs, contexts

    def absorb_turn(
        self,
        ids: Tensor,
        logps: Tensor | None,
        trajs: list[_Trajectory],
        rows: list[int],
        turn: int,
        contexts: list,
        envs: list,
        encodings: list[dict],
        G: int,
        script: list[list[str]] | None = None,
    ) -> list[int]:
        """Append turn ``turn`` (sampled ids [len(rows), T1] and their log-probs) to trajectories ``rows`` and answer
        it (tools or environment); the rows that go on."""
        a, T = self.adapter, self.settings.max_total_tokens
        eos = set(a.eos_ids.tolist())
        still = []
        for j, b in enumerate(rows):
            t = trajs[b]
            row_ids = ids[j].tolist()
            end = next((i for i, x in enumerate(row_ids) if x in eos), None)
            tokens = row_ids[: end + 1] if end is not None else row_ids
            room = T - len(t.ids)
            cut = len(tokens) > room
            tokens = tokens[:room]
            t.extend(tokens, True, turn)
            t.logps += logps[j, : len(tokens)].tolist() if logps is not None else [0.0] * len(tokens)
            text = a.tokenizer.decode([x for x in tokens if x not in eos], skip_special_tokens=True)
            t.texts.append(text)
            t.transcript.append({"role": "assistant", "text": text, "images": []})
            t.messages.append({"role": "assistant", "content": text})
            t.turn_rewards.append(0.0)
            t.turn_invalid.append(False)
            if end is None or cut:  # cut by max_new_tokens or the trajectory budget
                t.done = t.truncated = t.cut = True
                continue
            if script is not None and turn + 1 >= len(script[b]):  # the script's last turn
                t.done = True
                continue
            if self._respond(text, turn, t, contexts[b], envs[b], encodings[b // G]):
                still.append(b)
        return still

    def _respond(self, text: str, turn: int, t: _Trajectory, ctx: Any, env: Any, prompt: dict) -> bool:
        """Answer turn ``turn`` of trajectory ``t``: run its tool calls or step its environment, append the
        observation; whether the trajectory goes on."""
        from mmgrpo.tools import Observation, parse_tool_calls, run_tool_calls, state_anchor
        from mmgrpo.tools.env_guard import EnvironmentFault, checked_step

        s = self.settings
        last = turn == s.max_turns - 1
        if env is not None:
            try:
                obs, reward, done = checked_step(env, text, self.env_limits)
            except EnvironmentFault as e:  # raised, timed out, broke the protocol: the trajectory ends, counted
                self._env_fault(t, str(e))
                return False
            t.turn_rewards[-1], t.turn_invalid[-1] = float(reward), obs.invalid
            t.tool_errors += int(obs.invalid)
            observations, role = [obs], "user"
            if done or last:
                t.done, t.truncated = True, not done
                return False
        else:
            if last:  # a call in the last allowed turn is not run: the trajectory ends unfinished
                t.done, t.truncated = True, any(parse_tool_calls(text))
                return False
            ctx.turn, ctx.observations = turn, t.observations
            observations, role = self._run_calls(text, ctx, t, run_tool_calls), "tool"
            if not observations:  # no tool call: the answer
                t.done = True
                return False
        obs_ids, media, messages = self.encode_observation(observations, t, role)
        if len(t.ids) + len(obs_ids) + 1 > s.max_total_tokens:  # the observation and one more token do not fit
            t.done = t.truncated = True
            return False
        if env is None:
            t.turn_rewards[-1] = float(sum(o.reward for o in observations))
            t.turn_invalid[-1] = any(o.invalid for o in observations)
            t.tool_errors += sum(o.invalid for o in observations)
        t.observations += observations
        t.extend(obs_ids, False, turn)
        t.logps += [0.0] * len(obs_ids)
        if media:
            t.media.append(media)
            t.images += int(media["image_grid_thw"].shape[0])
            t.shown += [p["image"] for m in messages for p in m["content"] if p.get("image") is not None]
        t.messages += messages
        t.transcript += [
            {
                "role": m["role"],
                "text": "".join(p.get("text") or "" for p in m["content"]),
                "images": [p["image"] for p in m["content"] if p.get("image") is not None],
            }
            for m in messages
        ]
        seen = Observation(
            text="\n".join(o.text for o in observations),
            images=[i for m in messages for p in m["content"] if (i := p.get("image")) is not None],
        )
        t.anchors.append(state_anchor(seen))
        return True

    def count_failed_starts(self, trajs: list[_Trajectory], envs: list) -> None:
        """Count the trajectories whose environment could not start (build or ``reset`` faulted): each still takes
        its first turn (sampled with its group) and ends there (:class:`~mmgrpo.tools.env_guard.FailedEnvironment`)."""
        from mmgrpo.tools.env_guard import FailedEnvironment

        for t, env in zip(trajs, envs):
            if isinstance(env, FailedEnvironment):
                self._env_fault(t, env.reason)

    def _env_fault(self, t: _Trajectory, reason: str) -> None:
        """End trajectory ``t`` on an environment fault (:mod:`mmgrpo.tools.env_guard`): counted in ``env_errors``
        (``env/error_fraction``), marked truncated (``model.args.mask_truncated`` drops it), the first reason logged
        once per run; the turn keeps reward 0."""
        t.env_errors = 1
        t.done = t.truncated = True
        if not self._env_fault_logged:
            self._env_fault_logged = True
            logger.warning(
                "rollout.environment %r: %s; that trajectory ended (counted in env/error_fraction; "
                "this is logged once)",
                self.settings.environment,
                reason,
            )

    def _run_calls(self, text: str, ctx: Any, t: _Trajectory, run_tool_calls: Any) -> list:
        """The observations of one turn's tool calls (empty: no call), the trajectory's call budget applied."""
        from mmgrpo.tools import Observation, parse_tool_calls

        s = self.settings
        calls, errors = parse_tool_calls(text)
        if not calls and not errors:
            return []
        left = None if s.max_tool_calls is None else max(0, s.max_tool_calls - t.tool_calls)
        if left == 0:
            why = f"tool-call budget spent (rollout.max_tool_calls={s.max_tool_calls}); answer without tools"
            return [Observation(text=why, error=why, reward=float(self.limits["error_reward"]))]
        per_turn = s.max_calls_per_turn if left is None else min(s.max_calls_per_turn, left)
        observations = run_tool_calls(text, self.tools, ctx, max_calls=per_turn, **self.limits)
        t.tool_calls += min(len(calls), per_turn)
        return observations

    def _pack(self, trajs: list[_Trajectory], encodings: list[dict], G: int) -> TurnState:
        a = self.adapter
        B, T = len(trajs), self.settings.max_total_tokens
        ids = torch.full((B, T), a.pad_id, dtype=torch.long)  # [B, T]
        action = torch.zeros((B, T), dtype=torch.long)  # [B, T]
        valid = torch.zeros((B, T), dtype=torch.long)  # [B, T]
        turn = torch.full((B, T), -1, dtype=torch.long)  # [B, T]
        for b, t in enumerate(trajs):
            n = len(t.ids)
            ids[b, :n] = torch.tensor(t.ids, dtype=torch.long)
            action[b, :n] = torch.tensor(t.action, dtype=torch.long)
            valid[b, :n] = 1
            turn[b, :n] = torch.tensor(t.turn, dtype=torch.long)
        media = [stacked_media(t.media) for t in trajs]
        prompt_of = torch.arange(len(encodings)).repeat_interleave(G)  # [B]
        return TurnState(ids, action, valid, turn, prompt_of, encodings, media)

    def sampler_logprobs(self, trajs: list[_Trajectory]) -> Tensor:
        """The log-probs the decode loop drew each action token with (0 on observations and padding). [B, T]."""
        out = torch.zeros((len(trajs), self.settings.max_total_tokens))  # [B, T]
        for b, t in enumerate(trajs):
            out[b, : len(t.logps)] = torch.tensor(t.logps)
        return out

    # ------------------------------------------------------------------------------------- rollout driver

    def rollout(self, prompts: list[dict], group_size: int, keys: noise.NoiseKeys | None = None) -> Rollout:
        """The multi-turn :class:`~mmgrpo.types.Rollout` of B = P·G trajectories (the adapter's ``rollout``)."""
        a = self.adapter
        with a.media_scope():
            rows, envs = self.environments(prompts, group_size)
            encodings = [a.encode_prompt(row) for row in rows]
            columns = {k: v for encoder in a.encoders for k, v in encoder.columns(rows).items()}
            probe = None if self.probe is None else self.probe.targets(rows)  # [P] pseudo responses
            state, trajs = self.trajectories(rows, encodings, group_size, keys, envs, probe=probe)
        mask = state.action.float()  # [B, T]
        truncated = torch.tensor([t.truncated for t in trajs])  # [B]
        if a.args.mask_truncated:
            mask = mask * (~truncated).float()[:, None]
        rollout = Rollout(
            outputs=["\n".join(t.texts) for t in trajs],
            old_logprobs=torch.zeros_like(mask),
            mask=mask,
            group_size=group_size,
            prompt_index=state.prompt_of.clone(),
            truncated=truncated,
            state=state,
            turn_of_token=state.turn_of_token.clone(),
        )
        if a.engine is not None:  # sampled by vLLM: its log-probs for the importance correction, ours as old
            rollout.engine_logprobs = self.sampler_logprobs(trajs) * mask  # [B, T]
            rollout.old_logprobs = a.batched_logprobs(rollout, a.model) * mask  # [B, T]
        elif a.old_from_update:  # μ = 1: the update's own log-probs, detached (no forward)
            rollout.old_logprobs = on_policy.deferred_like(mask)  # [B, T] NaN
        elif a.args.old_logprobs == "sampler":  # as drawn by the decode loop: no extra forward
            rollout.old_logprobs = self.sampler_logprobs(trajs) * mask  # [B, T]
        else:
            rollout.old_logprobs = a.batched_logprobs(rollout, a.model) * mask  # [B, T]
        rollout.extras.update(reward_columns(a, rows, encodings, columns, state, trajs, group_size))
        rollout.validate()
        return rollout

    def supervised_loss(self, rows: list[dict]) -> Tensor:
        """Mean token cross-entropy of multi-turn targets (the warm-up's loss that teaches the tool-call format):
        ``row["target"]`` is a list of assistant turns (a string: one turn), teacher-forced; the tools (or the
        environment) answer each turn for real and their observations are context (mask 0), as in a rollout.

        Shape: P rows → [] (over every target token, end tokens included)."""
        a = self.adapter
        script = [[row["target"]] if isinstance(row["target"], str) else list(row["target"]) for row in rows]
        with a.media_scope():
            prompts, envs = self.environments(rows, 1)
            encodings = [a.encode_prompt(row) for row in prompts]
            state, _ = self.trajectories(prompts, encodings, 1, None, envs, script=script)
        logp = a.token_logprobs(a.model, state, torch.arange(len(rows)))  # [P, T]
        action = state.action.to(logp.device).float()  # [P, T]
        return -(logp * action).sum() / action.sum().clamp_min(1.0)

    @torch.no_grad()
    def evaluate(self, prompts: list[dict]) -> list[Transcript]:
        """Greedy multi-turn trajectories of held-out prompts, one per prompt: the assistant turns' text (joined by
        newlines, the turns kept apart, the whole exchange with its images: :class:`~mmgrpo.types.Transcript`)."""
        a = self.adapter
        with a.media_scope():
            rows, envs = self.environments(prompts, 1)
            encodings = [a.encode_prompt(row) for row in rows]
            columns = {k: v for encoder in a.encoders for k, v in encoder.columns(rows).items()}
            state, trajs = self.trajectories(rows, encodings, 1, None, envs, greedy=True)
        extras = reward_columns(a, rows, encodings, columns, state, trajs, 1)  # as a rollout's: scored the same way
        return [
            Transcript(t.texts, t.cut, t.transcript, t.turn_rewards, {k: v[b] for k, v in extras.items()})
            for b, t in enumerate(trajs)
        ]


def reward_columns(
    a: TokenSampler, rows: list[dict], encodings: list, columns: dict, state: TurnState, trajs: list, group_size: int
) -> dict[str, list]:
    """The B reward values of each column of P rows' trajectories (``Rollout.extras``; a held-out
    :class:`~mmgrpo.types.Transcript`'s ``columns``): the media ``columns`` of the rows and their images', repeated
    G times, :func:`trajectory_extras`, and ``completion_ids`` (each trajectory's action tokens)."""
    columns = {**columns, **a.image_columns(rows, encodings, columns.get("image_size"))}
    out = {k: [v for v in col for _ in range(group_size)] for k, col in columns.items()}
    out.update(trajectory_extras(trajs))
    out["completion_ids"] = [
        [x for x, m in zip(row.tolist(), act.tolist()) if m] for row, act in zip(state.completion_ids, state.action)
    ]
    return out


def trajectory_extras(trajs: list[_Trajectory]) -> dict[str, list]:
    """Reward columns of multi-turn trajectories, B values each: ``tool_calls`` (calls run, DeepEyes' tool bonus
    reads it), ``tool_errors``, ``num_turns`` (assistant turns), ``turn_rewards`` and ``turn_invalid`` (per turn:
    the summed tool/environment reward, whether an observation was an error), ``anchors`` (per turn: the key of
    the state the turn acted on — the prompt and its images, then each turn's observations, GiGPO's anchor states)
    and ``messages`` (the trajectory as chat messages, observation images included); with the ground-truth probe,
    ``gt_logprobs`` (per turn: ℓ before it, :mod:`.probe`); with an environment, ``env_errors`` (1 where an
    environment fault ended the trajectory, :mod:`mmgrpo.tools.env_guard`)."""
    out: dict[str, list] = {
        "tool_calls": [t.tool_calls for t in trajs],
        "tool_errors": [t.tool_errors for t in trajs],
        "num_turns": [len(t.texts) for t in trajs],
        "turn_rewards": [list(t.turn_rewards) for t in trajs],
        "turn_invalid": [list(t.turn_invalid) for t in trajs],
        "anchors": [list(t.anchors[: len(t.texts)]) for t in trajs],
        "messages": [list(t.messages) for t in trajs],
    }
    if any(t.gt_logprobs for t in trajs):
        out["gt_logprobs"] = [list(t.gt_logprobs) for t in trajs]
    if trajs and trajs[0].env_errors is not None:
        out["env_errors"] = [t.env_errors for t in trajs]
    return out


# -------------------------------------------------------------------------------------------- log-probs


def media_token_types(adapter: TokenSampler, ids: Tensor) -> Tensor:
    """``mm_token_type_ids`` of ``ids``: 1 at image pads, 2 at video pads, 0 elsewhere (what Qwen2.5-VL's
    ``get_rope_index`` reads to place the media). Shape: [n, L] → [n, L]."""
    image, video = media_pad_ids(adapter)
    return (ids == image).long() + 2 * (ids == video).long()


def media_pad_ids(adapter: TokenSampler) -> tuple[int, int]:
    """The model's image and video pad token ids (−1 where it has none)."""
    config = adapter.unwrapped().config
    return getattr(config, "image_token_id", -1), getattr(config, "video_token_id", -1)


def trajectory_logits(
    adapter: TokenSampler, model: torch.nn.Module, state: TurnState, index: Tensor, head: torch.nn.Linear | None
) -> tuple[Tensor, Tensor]:
    """(targets [n, T], logits [n, T, V] — or hidden states [n, T, H] with ``head`` — predicting them) of
    trajectories ``index``: the policy's tokens as targets (observation and padding positions hold ``pad_id``, so
    no media placeholder is scored), every position conditioned on the prompt and all tokens and images before it.

    The forward runs over the minibatch's longest trajectory only and is padded back to T (zeros, masked)."""
    comp = state.completion_ids[index]  # [n, T]
    action = state.action[index].bool()  # [n, T]
    valid = state.valid[index]  # [n, T]
    n, T = comp.shape
    t = max(1, int(valid.sum(1).max()))
    targets = torch.where(action, comp, torch.full_like(comp, adapter.pad_id))  # [n, T]
    prompts = state.prompt_of[index]  # [n]
    media = [state.media[b] for b in index.tolist()]
    device = adapter.device
    with head_outputs_hidden(head):
        if not any(media) and adapter.shares_prefix(model, "log-prob forward", adapter.args.prefix_sharing):
            unique, rows = torch.unique(prompts, return_inverse=True)  # U prompts, each encoded once; rows [n]
            batch = adapter.collate([state.encodings[p] for p in unique.tolist()])
            out = prefix_sharing.completion_logits(
                model,
                batch,
                rows.to(device),
                comp[:, :t].to(device),
                valid[:, :t].to(device),
                adapter.args.packed_training,
            )  # [n, t, V | H]
        else:
            if any(media) and adapter.args.prefix_sharing:
                prefix_sharing.warn_fallback_once(
                    "multi-turn log-prob forward", "trajectories carry observation images"
                )
            encodings = [merge_media(state.encodings[p], [m]) for p, m in zip(prompts.tolist(), media)]
            batch = adapter.collate(encodings, comp[:, :t], valid[:, :t])
            if "mm_token_type_ids" in batch:  # the observations' image pads too, for mRoPE over the whole sequence
                batch["mm_token_type_ids"] = media_token_types(adapter, batch["input_ids"])
            out = model(**batch, logits_to_keep=t + 1, use_cache=False).logits[:, :-1]  # [n, t, V | H]
    if t < T:
        out = torch.cat([out, out.new_zeros((n, T - t, out.shape[-1]))], dim=1)  # [n, T, V | H]
    return targets, out
