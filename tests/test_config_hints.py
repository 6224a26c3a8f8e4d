"""Suggestions ("did you mean", issue 36): an unknown config field or reward name is one line suggesting the
valid one, and TRL's option names are answered with where mmgrpo keeps them (docs/from_trl.md)."""

import dataclasses
from pathlib import Path

import pytest

from mmgrpo.cli import main
from mmgrpo.config import TrainConfig
from mmgrpo.suggest import TRL_NAMES

ROOT = Path(__file__).resolve().parents[1]
CFG = str(ROOT / "configs/quickstart.yaml")


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "num_generations=8",
            "unknown field 'num_generations': 'num_generations' is TRL's name; mmgrpo's is "
            "algorithm.group_size (docs/from_trl.md)",
        ),
        ("algorithm.num_generations=8", "mmgrpo's is algorithm.group_size"),
        ("use_vllm=true", "'use_vllm' is TRL's name; mmgrpo's is rollout.engine: vllm"),
        ("learning_rate=1e-5", "mmgrpo's is optim.lr"),
        ("algorithm.estimater=grpo", "; did you mean 'estimator'?"),
        ("rewards=[{name: acuracy}]", "unknown reward 'acuracy'; did you mean 'accuracy'?"),
        ("rewards=[{name: fromat}]", "did you mean 'format'?"),
    ],
)
def test_unknown_names_get_a_suggestion_in_one_line(override, expected, capsys, tmp_path):
    assert main(["train", CFG, "--dry-run", override, f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert expected in err
    if "reward" in override:
        assert "valid names" not in err  # the suggestion, not the 38 names


def test_trl_names_are_the_ones_docs_from_trl_maps_and_point_at_real_fields():
    doc = (ROOT / "docs/from_trl.md").read_text()
    cfg = TrainConfig()
    for trl, ours in TRL_NAMES.items():
        assert f"`{trl}" in doc, f"{trl} is not in docs/from_trl.md"
        section, _, rest = ours.partition(".")
        assert section.split("[")[0] in {f.name for f in dataclasses.fields(cfg)}, f"{trl} → {ours}"
        if rest and "." not in rest and section != "rewards[k]":
            assert rest in {f.name for f in dataclasses.fields(getattr(cfg, section))}, f"{trl} → {ours}"
