"""The TRL side of the benchmarks against TRL's ``GRPOTrainer`` (``vs_trl.py``, ``real_vs_trl.py``): the switch to
TRL's GPU rule for its fused lm_head on a CPU run, the trainer built with the settings every such run shares, and the
hook that records the prompt ids TRL feeds.

Imported inside the workers (each benchmark runs as a script, this folder on ``sys.path``), after TRL.
"""

from __future__ import annotations

from collections.abc import Callable

SHARED_CONFIG = dict(
    gradient_accumulation_steps=1,
    epsilon=0.2,
    top_p=1.0,
    top_k=0,
    save_strategy="no",
    report_to="none",
    bf16=False,
    fp16=False,
    dataloader_num_workers=0,
    disable_tqdm=True,
    log_completions=False,
)
"""``GRPOConfig`` settings of every benchmark run: one optimizer step per batch, clip ε 0.2, no top-k / top-p, fp32,
nothing saved, reported or printed, no dataloader workers."""


def use_gpu_head_rule() -> None:
    """Make a CPU run follow TRL's GPU rule for its fused lm_head: ``add_fused_lm_head`` (trl/trainer/utils.py)
    scores only the completion positions when ``_use_triton(device)`` holds (CUDA/XPU) and every position elsewhere,
    so every TRL user on a GPU gets the compact rule. The chunked kernel itself stays on its CPU path."""
    import trl.trainer.utils as trl_utils

    trl_utils._use_triton = lambda device: True


def grpo_trainer(model, processing_class, reward, rows: list[dict], callback, optimizers=(None, None), **config):
    """TRL's ``GRPOTrainer`` on the dataset of ``rows``, scored by ``reward``, with one ``TrainerCallback``; its
    ``GRPOConfig`` is :data:`SHARED_CONFIG` plus ``config`` (the run's own settings)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    return GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=GRPOConfig(**SHARED_CONFIG, **config),
        train_dataset=Dataset.from_list(rows),
        processing_class=processing_class,
        optimizers=optimizers,
        callbacks=[callback],
    )


def record_prompt_ids(trainer, record: Callable[[list, list], None]) -> None:
    """Call ``record(prompts, ids)`` each time ``trainer`` tokenizes a batch of prompts, ``ids`` the token ids it
    feeds (the first output of TRL's ``_tokenize_prompts``)."""
    tokenize = trainer._tokenize_prompts

    def tokenize_and_record(prompts):
        result = tokenize(prompts)
        record(prompts, result[0])
        return result

    trainer._tokenize_prompts = tokenize_and_record
