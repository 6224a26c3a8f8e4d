"""``mmgrpo demo RUN_DIR``: a Gradio app that shows what training changed, base model vs trained model.

The run's resolved ``config.yaml`` names the adapter, task and rewards. Both models are built by the SAME adapter
builder from that config: the base with the config's ``model.args`` as given, the trained one with the config's
LoRA settings and then the checkpoint's weights (``<checkpoint>/state/model.safetensors``, every tensor of the
exact module the trainer optimised, :mod:`mmgrpo.checkpoint`; loaded strictly — so a full fine-tune and a LoRA adapter
load the same way,
for every family). ``--base CHECKPOINT`` compares against another checkpoint of the same run instead.

Nothing here knows a family by name. The page is built from the held-out rows and the outputs:

- one "ask"/"generate" tab for the run's modality: a row with an ``image``/``images``, ``video`` or ``audio``
  column gets an upload box of that kind and the tab is called after it; a prompt-only row gets a prompt box.
  Each model answers greedily (``adapter.evaluate``) and, on request, with G samples (``adapter.rollout``); what
  an answer is shown as is decided by its type (text, image, video frames, audio — :func:`mmgrpo.samples.kind_of`).
  Rewards are the run's own reward functions, with the row's ground-truth columns when the example is unchanged
  and the prompt alone when it was edited (a reward that needs the ground truth then shows "n/a").
- a "training" tab: the reward curve and eval metrics from ``metrics.jsonl`` and the samples the trainer wrote
  (``samples_<stage>.json`` and their media files).

Safe by default: binds 127.0.0.1, no public share link unless ``--share``, uploads limited in size and type, a model
error is shown in the page and the app keeps serving. **A run directory from elsewhere is code**: its
``config.yaml`` can name rewards by import path (``module:function``) and set ``trust_remote_code``. Without
``--trust-run-config`` (``trust_run_config=False``) the demo imports none of that: rewards given by import path or
factory are not loaded (the page and the log say which; registry names and installed entry points load as
usual, :func:`mmgrpo.rewards.registry.reward_code_policy` ``"registered"``), and a config that sets
``trust_remote_code`` is refused with one line.

The package: :mod:`~mmgrpo.demo.run` (the run directory, checkpoints, both policies), :mod:`~mmgrpo.demo.answer`
(answering and scoring one row), :mod:`~mmgrpo.demo.kinds` (the table output kind → how the page shows it, one
module per kind), :mod:`~mmgrpo.demo.model_tab` and :mod:`~mmgrpo.demo.training_tab` (one module per tab) and
:mod:`~mmgrpo.demo.app` (the page and :func:`serve`).
"""

from __future__ import annotations

from mmgrpo.demo.answer import (
    _check_upload,
    _eval_rows,
    answer,
    ground_truth_line,
    media_key,
    samples_text,
    score,
)
from mmgrpo.demo.app import MAX_FILE_SIZE, build_app, serve
from mmgrpo.demo.kinds import KINDS, MEDIA_KEYS, UPLOAD_SUFFIXES
from mmgrpo.demo.run import (
    DemoError,
    Models,
    build_policy,
    find_checkpoint,
    load_run_config,
    untrusted_message,
    untrusted_rewards,
)
from mmgrpo.demo.training_tab import eval_table, read_metrics, reward_figure, sample_views

__all__ = [
    "KINDS",
    "MAX_FILE_SIZE",
    "MEDIA_KEYS",
    "UPLOAD_SUFFIXES",
    "DemoError",
    "Models",
    "_check_upload",
    "_eval_rows",
    "answer",
    "build_app",
    "build_policy",
    "eval_table",
    "find_checkpoint",
    "ground_truth_line",
    "load_run_config",
    "media_key",
    "read_metrics",
    "reward_figure",
    "sample_views",
    "samples_text",
    "score",
    "serve",
    "untrusted_message",
    "untrusted_rewards",
]
