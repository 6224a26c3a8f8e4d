"""Issue 49 (item 2): the turn driver reads a token policy only through the public sampling protocol
(``modalities/tokens/sampler.py``), the adapters implement it, and the adapter is built with its rollout driver."""

import ast
from pathlib import Path

import pytest
import torch

from mmgrpo import sharding
from mmgrpo.config import ConfigError, RolloutConfig
from mmgrpo.modalities.speech.audio_llm import AudioLLMAdapter
from mmgrpo.modalities.tokens.sampler import RolloutDriver, TokenSampler
from mmgrpo.modalities.tokens.turns import TurnRunner
from mmgrpo.modalities.video.adapter import VideoAdapter, build_video_adapter
from mmgrpo.modalities.vlm.adapter import SingleTurn, VLMAdapter, build_vlm_adapter
from mmgrpo.types import capabilities, declares, missing_method, required_capabilities

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = [ROOT / "modalities/tokens/turns.py", ROOT / "mmgrpo/multiturn.py"]


def private_reads(source: str) -> list[str]:
    """``line: expression`` of every read of another object's private member in ``source``: an attribute ``_x`` (not
    a dunder) of anything but ``self`` / ``cls``, and ``getattr(obj, "_x", ...)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        own = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") and not own:
            found.append((node.lineno, f"{node.lineno}: {ast.unparse(node)}"))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
        ):
            found.append((node.lineno, f"{node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def test_the_scan_finds_private_reads():
    """The scan itself: it flags another object's private members and private getattr strings, not ``self._x``."""
    source = (
        "def f(adapter, self):\n"
        "    adapter._sample(1)\n"
        "    x = getattr(adapter, '_unwrapped')()\n"
        "    adapter.model._orig_mod\n"
        "    self._rows = adapter.__class__\n"
    )
    assert private_reads(source) == [
        "2: adapter._sample",
        "3: getattr(adapter, '_unwrapped')",
        "4: adapter.model._orig_mod",
    ]


@pytest.mark.parametrize("path", DRIVERS, ids=lambda p: p.name)
def test_the_turn_driver_reads_no_private_member_of_another_object(path):
    found = private_reads(path.read_text())
    assert not found, f"{path.name} reads private members (use modalities/tokens/sampler.py TokenSampler):\n" + (
        "\n".join(found)
    )


def test_the_turn_driver_types_the_adapter_as_the_protocol():
    """``TurnRunner`` and the module's adapter parameters are annotated ``TokenSampler`` (no ``Any`` alias)."""
    tree = ast.parse(DRIVERS[0].read_text())
    annotations = [
        ast.unparse(arg.annotation)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        for arg in node.args.args
        if arg.arg == "adapter" and arg.annotation is not None
    ]
    assert annotations and set(annotations) == {"TokenSampler"}, annotations


@pytest.mark.parametrize("cls", [VLMAdapter, VideoAdapter, AudioLLMAdapter], ids=lambda c: c.__name__)
def test_token_adapters_implement_the_protocol_and_declare_multi_turn(cls):
    """Every method of :class:`TokenSampler` is defined on the class (public), and the class declares multi-turn."""
    methods = [name for name, v in vars(TokenSampler).items() if callable(v) and not name.startswith("_")]
    assert {"sample", "collate", "encode_prompt", "token_logprobs", "engine_sample", "unwrapped"} <= set(methods)
    assert [m for m in methods if not callable(getattr(cls, m, None))] == []
    assert "multi_turn" in capabilities(cls) and declares(cls, "multi_turn")


def test_built_adapters_satisfy_the_protocol_and_hold_their_driver(tiny_vlm_path):
    """Built without tools: the single-turn driver; with them: the turn runner. Both are rollout drivers and the
    adapter (VLM and video, built on it) is a TokenSampler instance."""
    single = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4})
    assert isinstance(single, TokenSampler) and isinstance(single.driver, SingleTurn)
    assert isinstance(single.driver, RolloutDriver) and single.driver.template_kwargs() == {}
    plain = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4}, rollout=RolloutConfig())
    assert isinstance(plain.driver, SingleTurn)  # a rollout section without tools or an environment: single-turn
    video = build_video_adapter(
        {"name_or_path": tiny_vlm_path, "max_new_tokens": 4},
        rollout=RolloutConfig(tools=["crop"], max_total_tokens=300),
    )
    assert isinstance(video, TokenSampler) and isinstance(video.driver, TurnRunner)
    assert isinstance(video.driver, RolloutDriver) and video.driver.adapter is video
    assert "tools" in video.driver.template_kwargs()


def test_multi_turn_under_fsdp_is_refused_at_first_use(tiny_vlm_path, monkeypatch):
    """The model is sharded only after accelerate's prepare, so the refusal moved from construction to the first
    rollout / evaluation / warm-up loss: one line naming DDP."""
    adapter = build_vlm_adapter(
        {"name_or_path": tiny_vlm_path, "max_new_tokens": 4},
        rollout=RolloutConfig(tools=["crop"], max_total_tokens=300),
    )
    row = {"prompt": "Which colour?", "image": None, "target": "red"}
    monkeypatch.setattr(sharding, "is_sharded", lambda module: True)
    for call in (
        lambda: adapter.rollout([row], 2),
        lambda: adapter.evaluate([row]),
        lambda: adapter.supervised_loss([row]),
    ):
        with pytest.raises(ConfigError, match=r"^rollout\.tools / rollout\.environment under FSDP.*DDP"):
            call()


def test_a_plugin_adapter_without_multi_turn_is_refused_once_built():
    """A plugin registered as a plain function is checked after it is built (no declared class at load): an adapter
    that does not declare ``multi_turn = True`` is missing the capability rollout.tools needs."""

    class Plain:
        multi_turn = False  # declared off: not the capability

    class Turns:
        multi_turn = True

    need = required_capabilities(kl="k3", ratio_norm=False, warmup_steps=0, tools=True)
    assert need == {"multi_turn": "rollout.tools"}
    assert missing_method(Plain(), need) == ("multi_turn", "rollout.tools")
    assert missing_method(Turns(), need) is None
    assert missing_method(torch.nn.Linear(1, 1), need) == ("multi_turn", "rollout.tools")
