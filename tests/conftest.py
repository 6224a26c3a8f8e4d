"""Shared fixtures: tiny models are built once per test session into a temporary cache (no download)."""

import os

import pytest
import torch

torch.set_num_threads(int(os.environ.get("MMGRPO_TEST_THREADS", "2")))


@pytest.fixture(scope="session")
def mmgrpo_cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("mmgrpo_cache")
    old = os.environ.get("MMGRPO_CACHE")
    os.environ["MMGRPO_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("MMGRPO_CACHE", None)
    else:
        os.environ["MMGRPO_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_vlm_path(mmgrpo_cache):
    from mmgrpo.modalities.vlm.tiny import resolve_model_path

    return resolve_model_path("tiny-qwen2.5-vl")
