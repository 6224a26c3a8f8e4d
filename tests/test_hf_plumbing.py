"""Shared Hugging Face plumbing (modalities/_hf.py): the tiny-model cache builds once, atomically."""

import pytest
import torch

from mmgrpo.config import ConfigError, LoraConfig
from mmgrpo.modalities import _hf


def test_cached_build_builds_once_and_leaves_nothing_half_written(tmp_path, monkeypatch):
    monkeypatch.setenv("MMGRPO_CACHE", str(tmp_path))
    calls = []

    def build(directory):
        calls.append(directory)
        (directory / "config.json").write_text("{}")

    first = _hf.cached_build("tiny-x", "config.json", build)
    second = _hf.cached_build("tiny-x", "config.json", build)
    assert first == second == tmp_path / "tiny-x" and len(calls) == 1
    assert calls[0] != first  # built in a temporary sibling, then renamed into place

    def broken(directory):
        (directory / "half.bin").write_text("x")
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        _hf.cached_build("tiny-y", "config.json", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-x"]  # no partial directory left behind


def test_unwrap_and_lora_errors():
    inner = torch.nn.Linear(2, 2)
    wrapped = torch.nn.Module()
    wrapped.module = torch.nn.Module()
    wrapped.module.module = inner
    assert _hf.unwrap(wrapped) is inner and _hf.unwrap(inner) is inner
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules \['nope'\]"):
        _hf.peft_lora(torch.nn.Sequential(torch.nn.Linear(2, 2)), LoraConfig(enabled=True, target_modules=["nope"]))


def test_cached_build_refuses_to_build_on_another_process_of_a_group(tmp_path, monkeypatch):
    """transformers writes weights on process 0 only once a process group exists: a build on process 1 would publish
    a model without weights, so it is refused with the way out; a model process 0 built is read on every process."""
    import torch.distributed as dist

    monkeypatch.setenv("MMGRPO_CACHE", str(tmp_path))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    with pytest.raises(RuntimeError, match=r"'tiny-z' is not in the cache .* build it on process 0 first"):
        _hf.cached_build("tiny-z", "config.json", lambda d: (d / "config.json").write_text("{}"))
    assert not any(tmp_path.iterdir())
    (tmp_path / "tiny-z").mkdir()
    (tmp_path / "tiny-z" / "config.json").write_text("{}")
    assert _hf.cached_build("tiny-z", "config.json", lambda d: None) == tmp_path / "tiny-z"
