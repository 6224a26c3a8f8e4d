"""The rollout engine the trainer owns (issue 35 item 2): every engine implementation satisfies
:class:`mmgrpo.types.EngineRollout`, the trainer uses nothing else of it, and the weight-push protocol shared by
the server client and the colocated engine (:meth:`EngineClient.push_model`) sends the whole model first, then the
trained tensors on top, and the whole model again when the engine refuses the part."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from mmgrpo.modalities.tokens.colocate import ColocateEngine
from mmgrpo.modalities.tokens.engine import EngineClient, VLLMClient
from mmgrpo.types import EngineRollout, UsesEngine

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("health", "configure_push", "push_model", "close")
ATTRIBUTES = ("name", "version")
IMPLEMENTATIONS = [VLLMClient, ColocateEngine]


def test_the_protocol_declares_what_the_trainer_uses():
    """``self.engine.<x>`` in mmgrpo/trainer.py: every x is a member of the protocol (and the protocol holds no
    member the trainer or the load-time check does not use)."""
    tree = ast.parse((ROOT / "mmgrpo" / "trainer.py").read_text())
    used = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Attribute)
        and n.value.attr == "engine"
        and isinstance(n.value.value, ast.Name)
        and n.value.value.id == "self"
    }
    assert used == {"configure_push", "push_model", "version", "close"}, used
    members = set(METHODS) | set(ATTRIBUTES)
    assert used <= members
    assert {m for m in members if callable(getattr(EngineRollout, m, None))} == set(METHODS)


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_every_engine_implements_the_protocol(cls):
    """The HTTP client and the colocated engine (class-level: building the latter needs vLLM) have every method
    of :class:`EngineRollout` with its parameters, its attributes, and the adapters' ``generate``; neither is an
    HTTP client in disguise."""
    for name in METHODS:
        ours = list(inspect.signature(getattr(EngineRollout, name)).parameters)
        theirs = list(inspect.signature(getattr(cls, name)).parameters)
        assert theirs == ours, (cls.__name__, name, theirs)
        assert getattr(cls, name) is not getattr(EngineClient, name) or name in (
            "configure_push",
            "push_model",
            "close",
        )
    for name in ATTRIBUTES:
        assert hasattr(cls, name)
    assert callable(cls.generate) and issubclass(cls, EngineClient)
    assert cls is VLLMClient or not issubclass(cls, VLLMClient)  # colocate mode is no HTTP client with a fake URL


def test_an_engine_instance_passes_the_runtime_check_and_a_partial_one_does_not():
    client = VLLMClient("http://127.0.0.1:9", timeout_s=1, secret="s" * 43)  # nothing is contacted
    assert isinstance(client, EngineRollout)

    class NoPush:
        name, version = "x", 0

        def health(self) -> dict:
            return {}

        def close(self) -> None: ...

    assert not isinstance(NoPush(), EngineRollout)


def test_token_adapters_take_the_engine_object():
    """The adapters' side (``use_engine(engine)``, :class:`UsesEngine`): the token families have it, and it keeps the
    trainer's engine object as is."""
    from mmgrpo.modalities.speech.adapter import WhisperAdapter
    from mmgrpo.modalities.tokens.engine import EngineSampling
    from mmgrpo.modalities.vlm.adapter import VLMAdapter

    assert issubclass(VLMAdapter, UsesEngine) and issubclass(WhisperAdapter, UsesEngine)
    assert list(inspect.signature(EngineSampling.use_engine).parameters) == ["self", "engine"]
    sampler = EngineSampling()
    engine = _Recording()
    sampler.use_engine(engine)
    assert sampler.engine is engine


class _Recording(EngineClient):
    """An engine whose transport records pushes and refuses a part when ``refuse`` is set."""

    def __init__(self):
        self.pushes: list[tuple[int, int, int | None]] = []
        self.refuse = False

    def health(self) -> dict:
        return {"ok": True, "version": self.version}

    def push(self, tensors, version, base=None) -> bool:
        if base is not None and self.refuse:
            return False
        self.pushes.append((len(tensors), version, base))
        self.version = version
        return True


def test_push_model_sends_the_whole_model_then_the_trained_part_then_the_whole_again_when_refused():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    model[1].weight.requires_grad_(False)
    model[1].bias.requires_grad_(False)
    engine = _Recording()
    engine.push_model(model, 1)
    engine.push_model(model, 2)
    assert engine.pushes == [(4, 1, None), (2, 2, 1)]  # whole (4 tensors), then the two trainable on version 1
    engine.refuse = True  # restarted, or pushed to by someone else
    engine.push_model(model, 3)
    assert engine.pushes[-1] == (4, 3, None) and engine.version == 3
    assert isinstance(engine, EngineRollout)
