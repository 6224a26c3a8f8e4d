"""The adapter families' tiny test cases: one table (``CASES``) that the adapter contract
(``tests/test_adapter_contract.py``), the batch-invariance test (``tests/test_world_size.py``) and the FSDP rollout
test (``tests/test_fsdp.py``) all take their families from.

Adding a model family = one entry in ``CASES`` (tiny ``model.args``, two prompt rows, LoRA targets, the state field
holding what a rollout drew); a registered adapter without an entry fails the contract's first test. A second
architecture of a family is one more entry naming its ``adapter`` (``vlm_idefics3``: SmolVLM under the ``vlm``
adapter; ``vlm_llava``, ``vlm_llava_onevision``, ``vlm_internvl``, ``vlm_gemma3``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from mmgrpo.config import LoraConfig
from mmgrpo.loader import load_builtins
from mmgrpo.plugins import ADAPTERS


@dataclass
class Case:
    """How to build a tiny instance of one adapter family for the contract."""

    args: dict
    """Tiny ``model.args``; ``name_or_path`` is replaced by the saved directory for the round-trip."""
    rows: Callable[[], list[dict]]
    """Two prompt rows of the kind the adapter reads."""
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    drawn: str = "completion_ids"
    """The field of the rollout's state that holds what was drawn (tokens, image tokens, latents)."""
    batch_invariant: dict = field(default_factory=dict)
    """Extra ``model.args`` under which a prompt's keyed rollout does not depend on the prompts batched with it."""
    adapter: str = ""
    """The ``model.adapter`` this case builds; empty: the case's own name."""


def _shapes_rows() -> list[dict]:
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    return ShapesTask(ShapesArgs(train_size=2, eval_size=1)).train_rows()[:2]


def _video_rows() -> list[dict]:
    from mmgrpo.tasks.video_motion import VideoMotionArgs, VideoMotionTask

    return VideoMotionTask(VideoMotionArgs(questions=["direction"], train_size=2, eval_size=1)).train_rows()[:2]


def _flow_rows() -> list[dict]:
    return [{"prompt": "a red circle top left"}, {"prompt": "a blue square bottom right"}]


def _flow_targets() -> list[str]:
    from mmgrpo.modalities.flow.adapter import FLOW_LORA_TARGETS

    return list(FLOW_LORA_TARGETS)


def _ar_image_rows() -> list[dict]:
    return [{"prompt": "a red circle top left", "seed": 0}, {"prompt": "a blue square bottom right", "seed": 1}]


def _speech_rows(question: str) -> Callable[[], list[dict]]:
    def rows() -> list[dict]:
        import shutil

        if shutil.which("espeak-ng") is None:
            pytest.skip("espeak-ng is not installed (scripts/setup_env.sh installs it): no speech to synthesise")
        from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

        return list(SpokenDigitsTask(SpokenDigitsArgs(question=question, train_size=2, eval_size=1)).train_rows())[:2]

    return rows


VIDEO_SAMPLING = {"fps": 3.0, "min_frames": 4, "max_frames": 4, "min_pixels": 3136, "max_pixels": 3136}

CASES: dict[str, Case] = {
    "vlm": Case({"name_or_path": "tiny-qwen2.5-vl", "max_new_tokens": 4}, _shapes_rows),
    "vlm_idefics3": Case({"name_or_path": "tiny-smolvlm", "max_new_tokens": 4}, _shapes_rows, adapter="vlm"),
    "vlm_llava": Case({"name_or_path": "tiny-llava", "max_new_tokens": 4}, _shapes_rows, adapter="vlm"),
    "vlm_llava_onevision": Case(
        {"name_or_path": "tiny-llava-onevision", "max_new_tokens": 4}, _shapes_rows, adapter="vlm"
    ),
    "vlm_internvl": Case({"name_or_path": "tiny-internvl", "max_new_tokens": 4}, _shapes_rows, adapter="vlm"),
    "vlm_gemma3": Case({"name_or_path": "tiny-gemma3", "max_new_tokens": 4}, _shapes_rows, adapter="vlm"),
    "video": Case({"name_or_path": "tiny-qwen2.5-vl", "max_new_tokens": 4, "video": VIDEO_SAMPLING}, _video_rows),
    "flow": Case(
        {"name_or_path": "tiny-sd3", "num_steps": 3, "eval_num_steps": 2, "resolution": 32, "device": "cpu"},
        _flow_rows,
        lora_targets=_flow_targets(),
        drawn="latents",
        batch_invariant={"encode_batch_size": 1},  # the text encoders' padding depends on the batch
    ),
    "ar_image": Case({"name_or_path": "tiny-janus", "guidance_scale": 3.0}, _ar_image_rows, drawn="image_tokens"),
    "whisper": Case(
        {"name_or_path": "tiny-whisper", "max_new_tokens": 6, "temperature": 0.8},
        _speech_rows("transcribe"),
        lora_targets=["q_proj", "v_proj"],
    ),
    "audio_llm": Case(
        {"name_or_path": "tiny-qwen2-audio", "max_new_tokens": 5, "temperature": 0.8}, _speech_rows("second_word")
    ),
}


def build(name: str, *, lora: bool, **over):
    """A tiny instance of family ``name`` (its contract case's args, updated by ``over``)."""
    load_builtins()
    case = CASES[name]
    cfg = LoraConfig(enabled=lora, r=4, alpha=8, target_modules=case.lora_targets)
    return ADAPTERS.get(adapter_of(name))({**case.args, **over}, seed=0, lora=cfg)


def adapter_of(name: str) -> str:
    """The ``model.adapter`` of contract case ``name``."""
    return CASES[name].adapter or name
