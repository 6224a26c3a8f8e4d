"""Issue 53: ``model.args.name_or_path`` is checked before any weights load (``modalities/model_names.py``), at
``--dry-run`` too: a built-in name, a real model (case-insensitive), a local path, a hub id in the Hugging Face cache,
or (online) a hub that answers; offline, one line with "did you mean" against the names this machine has. No real
weights are needed: the real-models root and the Hugging Face cache are fake directories."""

import json
import time
from pathlib import Path

import pytest

from mmgrpo.cli import main
from mmgrpo.config import ConfigError
from mmgrpo.modalities import model_names, real_models

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
SMALL = ["task.args.train_size=8", "task.args.eval_size=2"]


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """An empty Hugging Face cache and a real-models root where ``smollm2-135m-instruct`` is "set up" (a directory
    with its ``complete.json``; no weights: nothing is loaded)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MMGRPO_REAL_MODELS", str(tmp_path / "real"))
    made = tmp_path / "real" / "smollm2-135m-instruct"
    made.mkdir(parents=True)
    (made / "complete.json").write_text(json.dumps({"format": real_models.FORMAT}))
    return tmp_path


def _dry_run(tmp_path, name, capsys) -> tuple[int, str]:
    args = [f"output_dir={tmp_path / 'run'}", f"model.args.name_or_path={name}", *SMALL]
    rc = main(["train", QUICKSTART, "--dry-run", *args])
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("name", ["HuggingFaceTB/SmolLM2-135M-Instruct", "huggingfacetb/smollm2-135m-instruct"])
def test_an_uncached_hub_id_offline_is_one_line_with_the_registered_name(machine, name, capsys):
    rc, err = _dry_run(machine, name, capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "model.args.name_or_path" in err and "did you mean `smollm2-135m-instruct`" in err
    assert "HF_HUB_OFFLINE is set" in err and "set HF_HUB_OFFLINE=1" not in err


def test_a_registered_name_matches_whatever_its_case(machine, capsys):
    assert real_models.canonical("SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert real_models.resolve("SmolLM2-135M-Instruct", "vlm") == str(machine / "real" / "smollm2-135m-instruct")
    rc, err = _dry_run(machine, "SmolLM2-135M-Instruct", capsys)
    assert rc == 0, err
    # a registered name that is not set up is still the setup line, whatever its case
    (machine / "real" / "smollm2-135m-instruct" / "complete.json").unlink()
    rc, err = _dry_run(machine, "SMOLLM2-135M-INSTRUCT", capsys)
    assert rc == 2 and "setup_real_models.sh" in err and len(err.splitlines()) == 1


def test_a_close_name_gets_did_you_mean_and_an_unknown_one_the_names_this_machine_has(machine, capsys):
    rc, err = _dry_run(machine, "smollm2", capsys)
    assert rc == 2 and "did you mean `smollm2-135m-instruct`" in err
    rc, err = _dry_run(machine, "tiny-qwen25-vl", capsys)
    assert rc == 2 and "did you mean `tiny-qwen2.5-vl`" in err
    rc, err = _dry_run(machine, "someorg/completely-other", capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "did you mean" not in err and "tiny-qwen2.5-vl" in err and "smollm2-135m-instruct" in err
    assert "whisper-base" not in err  # another family's names are not offered to the vlm adapter


def test_a_real_model_of_another_family_is_named_with_its_adapter(machine):
    problem = model_names.name_problem("openai/whisper-tiny.en", "vlm")
    assert "did you mean `whisper-tiny.en`" in problem and "model.adapter: whisper" in problem


def test_local_paths_and_cached_hub_ids_pass_and_a_missing_path_is_one_line(machine, capsys):
    model_dir = machine / "my_model"
    model_dir.mkdir()
    assert model_names.name_problem(str(model_dir), "vlm") is None
    snapshot = machine / "hf" / "hub" / "models--someorg--cached-model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    assert model_names.name_problem("someorg/cached-model", "vlm") is None
    assert "did you mean `someorg/cached-model`" in model_names.name_problem("someorg/cached-modell", "vlm")
    rc, err = _dry_run(machine, "./no/such/model", capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "'./no/such/model'" in err


def test_online_an_unreachable_hub_fails_fast_not_after_retries(machine, monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    t0 = time.perf_counter()
    rc, err = _dry_run(machine, "HuggingFaceTB/SmolLM2-135M-Instruct", capsys)
    assert rc == 2 and time.perf_counter() - t0 < 15
    assert "cannot be reached" in err and "did you mean `smollm2-135m-instruct`" in err and "\n" not in err


@pytest.mark.parametrize(
    "adapter,name,suggested",
    [("whisper", "openai/whisper-tiny.en", "whisper-tiny.en"), ("flow", "tiny-sd-3", "tiny-sd3")],
)
def test_every_family_checks_its_names_at_load(machine, adapter, name, suggested):
    from mmgrpo.loader import load_builtins
    from mmgrpo.plugins import ADAPTERS

    load_builtins()
    spec = ADAPTERS.get(adapter)
    problem = spec.load_check(spec.options({"name_or_path": name}))
    assert problem is not None and f"did you mean `{suggested}`" in problem


def test_the_load_error_never_asks_to_set_what_is_set(monkeypatch, tmp_path):
    from mmgrpo.modalities._hf import loading

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as err, loading("someorg/not-cached"):
        raise OSError("We couldn't connect to 'https://huggingface.co'")
    assert "HF_HUB_OFFLINE is set" in str(err.value) and "set HF_HUB_OFFLINE=1" not in str(err.value)
