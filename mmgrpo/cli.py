"""Command line: ``mmgrpo train CONFIG [key.sub=value ...] [--dry-run]``, ``mmgrpo demo RUN_DIR`` and ``mmgrpo rewards
list``.

The same command works under ``accelerate launch`` (e.g. ``ACCELERATE_USE_CPU=1 accelerate launch --config_file
configs/accelerate/cpu_2proc.yaml -m mmgrpo train configs/quickstart.yaml``; ``--cpu`` starts one process). A
configuration mistake prints one line naming the field and exits with status 2; so does unusable data (a missing
column or media file in the first rows of a task, a column a reward needs), naming the file, the row and the
option to change. Running out of memory names the options that size the failing phase, and a rank whose peer died
names that rank (:mod:`mmgrpo.faults`), each in one line with status 1; a rank whose launcher died stops at the end
of its step with a checkpoint. ``--dry-run`` runs the same load-time check as ``train``
(:func:`mmgrpo.preflight.preflight`) and stops before any model loads, printing one summary line
(``--print-config``: the resolved YAML before it). Overrides and flags may come in any order
(``mmgrpo train cfg.yaml --dry-run overwrite=true``).
"""

from __future__ import annotations

import argparse
import os
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmgrpo", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser(
        "train",
        help="train a policy from a YAML config",
        description="Train a policy from a YAML config. A used output_dir is refused: continue it with "
        "resume=latest (the newest checkpoint; resume=PATH for another), or start over with overwrite=true (the old "
        "run is moved to <output_dir>.old-<time>, nothing is deleted).",
    )
    t.add_argument("config", help="YAML training config (see configs/)")
    t.add_argument(
        "overrides",
        nargs="*",
        help="key.sub=value overrides, e.g. steps=10 output_dir=runs/x, resume=latest (continue the run in "
        "output_dir), overwrite=true (start over in a used output_dir)",
    )
    t.add_argument(
        "--dry-run",
        action="store_true",
        help="run the load-time check (config, the first rows and their media, rewards) and print a one-line "
        "summary; load no model, do not train",
    )
    t.add_argument("--print-config", action="store_true", help="with --dry-run: also print the resolved config")
    t.add_argument(
        "--trust-config",
        action="store_true",
        help="with --dry-run: the config is yours, so import and run the code it names as train does before the "
        "model loads (import-path rewards run once on a synthetic rollout, own tools imported and checked, an own "
        "environment's reset/step probed); by default --dry-run reads that code's source and imports nothing",
    )
    d = sub.add_parser("demo", help="serve a Gradio app comparing a run's base and trained models (needs .[demo])")
    d.add_argument("run_dir", help="run directory written by mmgrpo train (config.yaml, checkpoints/)")
    d.add_argument(
        "--checkpoint",
        help="trained checkpoint: a path or a name under checkpoints/ (default: final, else newest step)",
    )
    d.add_argument("--base", help="compare against this checkpoint instead of the base model the config names")
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    d.add_argument("--port", type=int, default=None, help="port (default: Gradio's, 7860 or the next free one)")
    d.add_argument("--share", action="store_true", help="also open a public Gradio share link (off by default)")
    d.add_argument(
        "--trust-run-config",
        action="store_true",
        help="run the code the run's config.yaml names (rewards given as module:function, trust_remote_code); "
        "by default the demo loads only registered rewards: a run directory from elsewhere is code",
    )
    s = sub.add_parser(
        "rollout-server",
        help="serve the config's policy on vLLM for rollout.engine: vllm (needs scripts/setup_vllm.sh)",
    )
    s.add_argument("config", help="the YAML training config the trainer will run (model, seed, rollout.url)")
    s.add_argument("overrides", nargs="*", help="key.sub=value overrides, as for train")
    s.add_argument("--python", help="interpreter of the vLLM environment (default: .venv-vllm/bin/python)")
    r = sub.add_parser("rewards", help="reward registry")
    r.add_argument("action", choices=["list"], help="list: print the registered rewards")
    return p


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; for ``train``, ``key=value`` overrides may come before or after the flags."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest:
        if args.command != "train" or any(a.startswith("-") or "=" not in a for a in rest):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        args.overrides = [*args.overrides, *rest]
    return args


ESCAPES_ENV = "MMGRPO_ESCAPED_ERRORS"
"""When set, a file to which :func:`main` appends one line per exception that escapes it (a traceback the user
sees): the test suite counts them over every CLI run it makes (tests/conftest.py)."""


DEPRECATIONS_ENV = "MMGRPO_DEPRECATIONS"
"""When set to a file whose first line is this interpreter's ``sys.prefix``, :func:`note_deprecations` appends to
it one line per deprecation notice the process raises: the test suite counts them with its own (tests/deprecations.py),
and fails when there is any."""


def note_deprecations() -> None:
    """In a ``python -m mmgrpo`` process (``accelerate launch`` ranks included) started by the test suite
    (:data:`DEPRECATIONS_ENV`), note each FutureWarning, DeprecationWarning and PendingDeprecationWarning it raises,
    the DeprecationWarnings Python hides outside ``__main__`` included, each still shown as usual. Nothing happens
    without the variable, or for an interpreter of another environment (the vLLM venvs)."""
    import warnings

    path = os.environ.get(DEPRECATIONS_ENV)
    try:
        with open(path or "", encoding="utf-8") as f:
            if f.readline().rstrip("\n") != sys.prefix:
                return
    except OSError:
        return
    kinds = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
    for kind in kinds:
        warnings.filterwarnings("default", category=kind)
    show = warnings.showwarning

    def note(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, kinds):
            first = (str(message).splitlines() or [""])[0][:300]
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{category.__name__}: {first} ({filename}:{lineno}; argv {sys.argv[1:]})\n")
        show(message, category, filename, lineno, file, line)

    warnings.showwarning = note


def main(argv: list[str] | None = None) -> int:
    """The ``mmgrpo`` command. Known mistakes and faults end in one line and an exit status; anything else escapes
    as a traceback, and is noted in ``$MMGRPO_ESCAPED_ERRORS`` when set (:data:`ESCAPES_ENV`)."""
    try:
        return _main(argv)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        if os.environ.get(ESCAPES_ENV):
            first = (str(e).splitlines() or [""])[0][:300]
            with open(os.environ[ESCAPES_ENV], "a", encoding="utf-8") as f:
                f.write(f"{type(e).__name__}: {first} | argv {sys.argv[1:] if argv is None else argv}\n")
        raise


def _main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if "" not in sys.path and os.getcwd() not in sys.path:  # as `python -m mmgrpo` does: rewards in ./my_rewards.py
        sys.path.insert(0, os.getcwd())
    from mmgrpo.config import ConfigError, dump_config
    from mmgrpo.loader import load_config

    if args.command == "rewards":
        from mmgrpo.loader import load_builtins
        from mmgrpo.rewards import list_rewards

        load_builtins()  # tasks register their own rewards too
        rows = list_rewards()
        width = max(len(name) for name, _ in rows)
        for name, description in rows:
            print(f"{name:<{width}}  {description}")
        return 0
    if args.command == "demo":
        return _demo(args)
    if args.command == "rollout-server":
        return _rollout_server(args)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"mmgrpo: config error: {e}", file=sys.stderr)
        return 2
    from mmgrpo.types import DataError, EngineError

    if args.dry_run:
        from mmgrpo.preflight import preflight
        from mmgrpo.rewards.registry import describe_reward_code, reward_code_policy
        from mmgrpo.row_check import LoadReport, reward_resolutions

        report = LoadReport()
        trusted = args.trust_config  # the user's own config: its code imported and run as `train` does
        try:
            with reward_code_policy("import" if trusted else "check"):  # import-path code: checked, never imported
                task = preflight(cfg, report)  # the check `train` runs before any model loads: task, rows, rewards
                report.rewards = reward_resolutions(cfg)
                if trusted:
                    from mmgrpo.reward_check import load_rewards

                    load_rewards(cfg, task.train_rows())  # each reward once on a synthetic rollout, as train does
        except ConfigError as e:
            print(f"mmgrpo: config error: {e}", file=sys.stderr)
            return 2
        except DataError as e:
            print(f"mmgrpo: data error: {e}", file=sys.stderr)
            return 2
        except EngineError as e:
            print(f"mmgrpo: error: {e}", file=sys.stderr)
            return 2
        if args.print_config:
            print(dump_config(cfg), end="")
        for r in cfg.rewards if not trusted else []:  # a config is code: say which rewards are, and not run
            note = describe_reward_code(r.name, r.kwargs)
            if note:
                print(f"mmgrpo: note: {note}", file=sys.stderr)
        comment = "# " if args.print_config else ""  # after the YAML: a comment, so stdout stays YAML
        print(f"{comment}mmgrpo: dry run OK: {report.line()}")
        return 0
    from safetensors import SafetensorError

    from mmgrpo import faults
    from mmgrpo.checkpoint import CheckpointError, RunDirError
    from mmgrpo.rewards.runner import RewardError
    from mmgrpo.trainer import train

    main_process = int(os.environ.get("RANK", "0")) == 0
    faults.exit_with_launcher()  # a rank of accelerate launch stops (with a checkpoint) when its launcher dies
    try:
        summary = train(cfg)
    except ConfigError as e:  # adapter/task/reward options are validated when they are built
        print(f"mmgrpo: config error: {e}", file=sys.stderr)
        return 2
    except (FloatingPointError, CheckpointError, EngineError) as e:  # the last good checkpoint is kept
        print(f"mmgrpo: error: {e}", file=sys.stderr)
        return 1
    except RewardError as e:  # on_error: raise (a reward raised, timed out or returned NaN/inf): its first line
        print(f"mmgrpo: error: {_first_line(e)}; {_resume_hint(cfg)}", file=sys.stderr)
        return 1
    except DataError as e:  # the first rows of a dataset are checked when the task is built
        print(f"mmgrpo: data error: {e}", file=sys.stderr)
        return 2
    except RunDirError as e:  # output_dir locked by a live run, not writable, disk full while saving
        print(f"mmgrpo: error: {e}", file=sys.stderr)
        return 2
    except (OSError, SafetensorError) as e:  # any other file-system fault (disk full, read-only) while writing
        print(f"mmgrpo: error: {_os_error_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside the training steps (model loading, warm-up)
        if main_process:
            print(f"mmgrpo: interrupted; {_resume_hint(cfg)}", file=sys.stderr)
        return 130
    except (MemoryError, RuntimeError) as e:  # out of host/device memory, or a peer process died: one line each
        oom = faults.memory_line(e, cfg)
        line = oom or faults.peer_line(e)
        if line is None:
            raise
        print(f"mmgrpo: error: {line}" + ("" if oom else f"; {_resume_hint(cfg)}"), file=sys.stderr)
        return 1
    evals = {k: round(v, 4) for k, v in summary.items() if k.startswith("eval/")}
    if evals and int(os.environ.get("RANK", "0")) == 0:  # once, not once per process
        print("mmgrpo: " + " ".join(f"{k}={v}" for k, v in sorted(evals.items())))
    return 0


def _first_line(e: Exception) -> str:
    """The first line of an exception's message (a user's reward may raise with several)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _os_error_line(e: Exception) -> str:
    """One line for a file-system error: the file, the reason, and what to do."""
    reason = getattr(e, "strerror", None) or (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    where = f"{e.filename}: " if getattr(e, "filename", None) else ""
    return f"{where}{reason}; free disk space or use a writable output_dir, then continue with resume=latest"


def _resume_hint(cfg) -> str:
    """What the user can do after an interruption: resume from the newest checkpoint, or start again."""
    from mmgrpo import checkpoint as ckpt

    try:
        found = ckpt.find(os.path.realpath(cfg.output_dir), "latest")  # the directory the run used
    except FileNotFoundError:
        return (
            f"no checkpoint was saved in {cfg.output_dir}; run the same command again to start over "
            "(the output_dir is accepted while it holds no checkpoint)"
        )
    return f"the newest checkpoint is {found}; continue with resume=latest"


def _demo(args) -> int:
    try:
        import gradio  # noqa: F401
    except ImportError:
        print("mmgrpo: the demo needs gradio: pip install -e '.[demo]'", file=sys.stderr)
        return 2
    from mmgrpo.demo import DemoError, serve

    try:
        serve(
            args.run_dir,
            args.checkpoint,
            args.base,
            host=args.host,
            port=args.port,
            share=args.share,
            trust_run_config=args.trust_run_config,
        )
    except DemoError as e:
        print(f"mmgrpo: demo: {e}", file=sys.stderr)
        return 2
    return 0


def _rollout_server(args) -> int:
    """``mmgrpo rollout-server CONFIG``: run vLLM on the config's model in its own environment until stopped."""
    from mmgrpo.config import ConfigError
    from mmgrpo.loader import load_config, rollout_server

    try:
        cfg = load_config(args.config, args.overrides)
        cmd, taken, serve = rollout_server(cfg, args.python)
    except ConfigError as e:
        print(f"mmgrpo: config error: {e}", file=sys.stderr)
        return 2
    if taken:
        print(
            f"mmgrpo: rollout.url {cfg.rollout.url} is in use (another rollout server?): pick another port",
            file=sys.stderr,
        )
        return 2
    print("mmgrpo: " + " ".join(cmd), file=sys.stderr)
    # a stop signal reaches vLLM's engine processes too (their process group); the push secret goes to the server in
    # its environment and to this user's trainers in a 0600 key file, never on a command line or in this log
    return serve()


if __name__ == "__main__":
    sys.exit(main())
