"""Issue 35 item 4: sharded checkpoints (mmgrpo/sharded_checkpoint.py, torch.distributed.checkpoint).

In one process (DCP without a process group): the sharded layout saves and loads a model with tied weights and its
AdamW state exactly, reads back offline, and refuses in one line a crafted index (a pickle that would run code), an
index that names a non-tensor, and a truncated shard file; a run with ``checkpoint.sharded=true`` writes step
checkpoints in that layout and resumes from them, and its ``final/`` is the gathered layout with the Hugging Face
export. tests/test_fsdp.py saves on 2 FSDP processes and resumes on 1 and on 2.
"""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from mmgrpo import sharded_checkpoint as sc
from mmgrpo.loader import load_config
from mmgrpo.trainer import Trainer
from tests.test_reliability import TINY
from tests.test_trainer import QUICK, VARIED, VARIED_REWARD, assert_trained_after


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.layer = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight  # tied, as an LM head
        self.register_buffer("positions", torch.arange(5))


def _trained(seed: int) -> tuple[Tiny, torch.optim.AdamW]:
    torch.manual_seed(seed)
    model = Tiny()
    groups = [{"params": [model.embed.weight], "lr": 1e-2}, {"params": list(model.layer.parameters()), "lr": 1e-3}]
    opt = torch.optim.AdamW(groups, weight_decay=0.1)
    for _ in range(2):
        loss = model.head(model.layer(model.embed(torch.tensor([1, 2, 3])))).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_the_sharded_layout_saves_and_loads_weights_and_adamw_state_exactly(tmp_path):
    model, opt = _trained(0)
    sc.save(tmp_path, model, opt, world_size=1, main=True)
    assert sorted(p.name for p in (tmp_path / sc.DIR).iterdir()) == [".metadata", "__0_0.distcp"]
    assert sc.problem(tmp_path) is None
    fresh, fresh_opt = _trained(1)  # other weights, other moments
    assert not torch.equal(fresh.layer.weight, model.layer.weight)
    assert sc.mismatch(tmp_path, fresh, fresh_opt) is None
    sc.load(tmp_path, fresh, fresh_opt)
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k
    assert fresh.head.weight is fresh.embed.weight  # still tied
    saved, loaded = opt.state_dict(), fresh_opt.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]  # lr per group, weight decay, betas
    for i, entry in saved["state"].items():
        for key, value in entry.items():
            assert torch.equal(value, loaded["state"][i][key]), (i, key)
    weights, optim = sc.read(tmp_path)  # offline, the whole tensors
    assert torch.equal(weights["layer.weight"], model.layer.weight) and torch.equal(
        weights["positions"], torch.arange(5)
    )
    assert torch.equal(optim["state"]["layer.bias"]["exp_avg_sq"], saved["state"][2]["exp_avg_sq"])
    other = torch.nn.Linear(6, 6)
    assert "does not match the model" in sc.mismatch(tmp_path, other)


class Boom:
    def __reduce__(self):
        return (print, ("this ran",))  # what a crafted checkpoint would do with os.system


def test_a_crafted_or_damaged_index_is_refused_in_one_line_without_running_code(tmp_path, capsys):
    model, opt = _trained(0)
    sc.save(tmp_path, model, opt, world_size=1, main=True)
    index = tmp_path / sc.DIR / ".metadata"
    good = index.read_bytes()
    index.write_bytes(pickle.dumps(Boom()))
    why = sc.problem(tmp_path)
    assert "builtins.print is not part of DCP's metadata" in why and "\n" not in why
    with pytest.raises(sc.ShardedCheckpointError):
        sc.load(tmp_path, *_trained(1))
    assert "this ran" not in capsys.readouterr().out
    meta = pickle.loads(good)
    meta.state_dict_metadata["extra"] = __import__("torch").distributed.checkpoint.metadata.BytesStorageMetadata()
    index.write_bytes(pickle.dumps(meta))
    assert "lists 'extra', which is not a tensor" in sc.problem(tmp_path)
    index.write_bytes(good)
    shard = tmp_path / sc.DIR / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])
    assert "shorter than its index says" in sc.problem(tmp_path)
    (tmp_path / sc.INDEX).write_text(json.dumps({"format": "other"}))
    assert "not a sharded checkpoint index" in sc.problem(tmp_path)


FAST = [*TINY, "checkpoint.every=1", "checkpoint.sharded=true"]


@pytest.mark.slow
def test_a_run_with_sharded_checkpoints_resumes_from_them_and_exports_a_normal_final(
    tmp_path, mmgrpo_cache, monkeypatch
):
    """Single process, ``checkpoint.sharded=true``: step checkpoints in the DCP layout (no model/ export), a run cut
    after step 1 and resumed from it ends with the uninterrupted run's weights and optimizer state, bit for bit, and
    ``final/`` holds the gathered state and a Hugging Face directory that loads. The reward varies within groups
    (tests/test_trainer.py's VARIED_REWARD): the resumed step moves the weights."""
    from safetensors.torch import load_file

    (tmp_path / "varied_reward.py").write_text(VARIED_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = [*FAST, "steps=2", VARIED]
    full = Trainer(load_config(QUICK, [*run, f"output_dir={tmp_path / 'full'}"]))
    full.run()
    step1 = tmp_path / "full/checkpoints/step-000002/state"
    assert sc.is_sharded(step1) and not (step1 / "model.safetensors").exists()
    assert not (tmp_path / "full/checkpoints/step-000002/model").exists()
    Trainer(load_config(QUICK, [*run, "stop_after=1", f"output_dir={tmp_path / 'cut'}"])).run()
    cut, _ = sc.read(tmp_path / "cut/checkpoints/step-000001/state")
    Trainer(load_config(QUICK, [*run, "resume=latest", f"output_dir={tmp_path / 'cut'}"])).run()
    for name in ("model.safetensors", "optimizer.safetensors"):
        a = load_file(str(tmp_path / "full/checkpoints/final/state" / name))
        b = load_file(str(tmp_path / "cut/checkpoints/final/state" / name))
        assert sorted(a) == sorted(b)
        if name == "model.safetensors":
            assert_trained_after(cut, b, tmp_path / "cut", 1)
        for k in a:
            assert torch.equal(a[k], b[k]), (name, k)
    final = tmp_path / "full/checkpoints/final"
    assert (final / "model/config.json").is_file() and not sc.is_sharded(final / "state")
    weights, _ = sc.read(step1)  # the last step checkpoint holds the final weights
    gathered = load_file(str(final / "state/model.safetensors"))
    for k, v in gathered.items():
        assert torch.equal(weights[k], v), k
