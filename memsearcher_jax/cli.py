"""`memsearcher-jax`: train, eval, export-hf, index, serve-retriever, plan.

Configs are ml-collections files (`--config configs/default.py`); any value can be
overridden on the command line, e.g. `--config.rl.group_size=8 --config.model.dtype=bfloat16`.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import sys
import threading

from memsearcher_jax.agent.rollout import SearchFailuresError
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.runtime.distributed import initialize_from_env
from memsearcher_jax.settings.config_utils import (
    CONFIGS_DIR,
    ConfigError,
    load_config,
    pretrain_schema,
    split_overrides,
    training_schema,
)

DEFAULT_CONFIG = os.path.join(CONFIGS_DIR, "default.py")
PRETRAIN_CONFIG = os.path.join(CONFIGS_DIR, "base_v8.py")

_OVERRIDE_HELP = ("Override any config value with --config.SECTION.KEY=VALUE "
                  "(e.g. --config.train.steps=10 --config.rl.group_size=4).")


def _config_arg(p: argparse.ArgumentParser):
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help=f"ml-collections config file with get_config() (default: configs/default.py). {_OVERRIDE_HELP}")


def _run_args(p: argparse.ArgumentParser, func):
    """The options of a resumable run."""
    p.add_argument("--fresh", action="store_true",
                   help="start over in train.output_dir: remove what an earlier run of this command wrote there "
                        "(checkpoints, logs, its export) and nothing else; a directory holding other files, or "
                        "without the .memsearcher-run marker a run writes, is refused (default: resume from its "
                        "latest checkpoint)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.set_defaults(func=func)


def _load(args, schema=training_schema) -> object:
    """The command's config: the file's own keys held against `schema()` (an unknown or misspelled
    key, a missing section: a ConfigError naming it), then the --config.* overrides. A training or
    evaluation config is the typed Settings, built once here (settings.load_settings) and handed down:
    every key, the file's or its default; `pretrain` reads configs/base_v8.py's keys as they are."""
    if schema is not training_schema:
        return load_config(args.config, args.config_overrides, schema())
    from memsearcher_jax.settings import load_settings  # light: no JAX

    return load_settings(args.config, args.config_overrides)


def _resumable(job, schema=training_schema):
    """A run command: the config, or with --print-config just its print."""
    def cmd(args) -> int:
        cfg = _load(args, schema)
        if args.print_config:  # printed as the ConfigDict a file gives (the settings' every key)
            print(cfg.to_config() if hasattr(cfg, "to_config") else cfg)
        else:
            job(cfg, args)
        return 0
    return cmd


def _train(settings, args):
    from memsearcher_jax.app.jobs import train_job

    train_job(settings, resume=not args.fresh)


def _pretrain(cfg, args):
    from memsearcher_jax.pretrain import probe_checkpoint, probe_table, run_pretrain

    if args.probe_step is not None:
        if args.fresh:
            raise UserInputError("--probe-step reads a run's checkpoint and --fresh starts the run over: pass one")
        print(probe_table(probe_checkpoint(cfg, args.probe_step, args.probe_items)))
        return
    run_pretrain(cfg, resume=not args.fresh, argv=args.command_argv)


cmd_train, cmd_pretrain = _resumable(_train), _resumable(_pretrain, pretrain_schema)


def _workflow_names() -> tuple[str, ...]:
    from memsearcher_jax.agent.workflows import workflow_names  # light: no JAX

    return workflow_names()


def cmd_eval(args) -> int:
    from memsearcher_jax.app.jobs import run_eval
    from memsearcher_jax.app.validation import check_writable

    settings = _load(args)
    if args.out:  # before any work: a read-only --out failed after the whole evaluation, its results lost
        check_writable(args.out, f"--out {args.out}")
    run_eval(settings, checkpoint=args.checkpoint, model_dir=args.model, split=args.split, limit=args.limit,
             out=args.out, workflow=args.workflow, objectives=args.objectives)
    return 0


def cmd_export(args) -> int:
    from memsearcher_jax.app.jobs import export_checkpoint
    from memsearcher_jax.app.validation import check_writable

    check_writable(args.out, f"--out {args.out}")  # before the checkpoint is read
    path = export_checkpoint(args.checkpoint, args.out, step=args.step, dtype=args.dtype, best=args.best,
                             adapters_only=args.adapters_only, overwrite=args.overwrite)
    print(f"wrote {'PEFT LoRA adapters' if args.adapters_only else 'Hugging Face model'} to {path}")
    return 0


def _number_arg(kind, ok, expected: str, bound: str):
    """An argparse type: `kind(text)`, refused with `must be {bound}` unless `ok(value)`."""
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    return convert


# --device-memory-gib: 0 would divide by zero in the plan (NaN is refused too); --probe-items: an
# empty probe has no accuracy.
_positive_gib = _number_arg(float, lambda v: v > 0, "a number of GiB", "> 0")
_positive_int = _number_arg(int, lambda v: v >= 1, "a whole number", ">= 1")


def cmd_plan(args) -> int:
    from memsearcher_jax.plan.planner import main as plan_main
    from memsearcher_jax.rules.config_rules import config_problems, refuse

    settings = _load(args)
    # The rules `train` asks, before the table: a plan of a config training would refuse is no
    # answer. Not the files: the plan is often made away from the pod that holds the data.
    refuse(config_problems(settings, files=False))
    return plan_main(settings, args)


def _add_pretrain(sub) -> None:
    """The `pretrain` command: train the reading base, or read one checkpoint of a run (--probe-step)."""
    p = sub.add_parser("pretrain", help="pretrain the reading base model (resumes from train.output_dir)",
                       description="Build the reading vocabulary, pretrain a tiny model on the reading curriculum "
                                   "(binding drills, cloze questions over up to 16 passages, associative recall, "
                                   "correct agent episodes in every workflow's format over random worlds), "
                                   "report the reading probe on names it never saw, and export the base as a "
                                   "Hugging Face directory. " + _OVERRIDE_HELP)
    p.add_argument("--config", default=PRETRAIN_CONFIG,
                   help="ml-collections config file (default: configs/base_v8.py, which made the shipped "
                        "base, reading_v8: ~13 hours on a 2-core CPU; its phases are the list cfg.phases, "
                        f"e.g. --config.phases.0.learning_rate=1e-3). {_OVERRIDE_HELP}")
    p.add_argument("--probe-step", type=int, default=None, metavar="STEP",
                   help="instead of training: read checkpoint STEP of the run in train.output_dir (0: its "
                        "latest) and print its reading by relation at 2, 8 and 16 passages and on binding "
                        "pairs, on items neither the progress nor the final probe uses; writes nothing, so the "
                        "run may still be training (default: train)")
    p.add_argument("--probe-items", type=_positive_int, default=256,
                   help="with --probe-step: items per context length, and pairs (default: 256)")
    _run_args(p, cmd_pretrain)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memsearcher-jax",
        description="Train LLM search agents with multi-context GRPO (MemSearcher) in JAX. On a multi-host pod "
                    f"or cluster every host runs `memsearcher-jax {MULTIHOST_FLAG} train ...` (joins the job first).",
        epilog=_OVERRIDE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("train", help="run GRPO training (resumes from the latest checkpoint in train.output_dir)",
                       description="Run multi-context GRPO. With configs/default.py: start from the shipped reading "
                                   "base, build the synthetic world, warm-start on a flawed demonstrator, evaluate "
                                   "held-out EM, train with GRPO, evaluate again, plot the learning curve. "
                                   + _OVERRIDE_HELP)
    _config_arg(p)
    _run_args(p, cmd_train)

    _add_pretrain(sub)

    p = sub.add_parser("eval", help="greedy evaluation: EM/F1 per benchmark, per-turn context lengths, JSONL",
                       description="Evaluate a checkpoint or a Hugging Face model directory greedily "
                                   "(up to agent.eval_max_turns turns). " + _OVERRIDE_HELP)
    _config_arg(p)
    p.add_argument("--checkpoint", help="a training output dir (latest step) or its checkpoints/ dir")
    p.add_argument("--model", help="a Hugging Face model directory (instead of --checkpoint)")
    p.add_argument("--split", default=None,
                   help="one set to evaluate: for the synthetic world 'heldout' (default) or 'train'; for real "
                        "data (world.enabled=false) a set name under data.eval_path, e.g. bamboogle (default: all)")
    p.add_argument("--limit", type=int, default=0, help="evaluate at most this many questions (0: all)")
    p.add_argument("--workflow", choices=_workflow_names(), default=None, help="override agent.workflow")
    p.add_argument("--objectives", type=int, default=None,
                   help="synthetic world: questions asked at once, answered 'a1; a2' (overrides world.objectives; "
                        "EM and F1 become means per objective)")
    p.add_argument("--out", default="", help="directory for the trajectories JSONL and the results table")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("export-hf", help="write a Hugging Face model directory from a checkpoint",
                       description="Convert an Orbax training checkpoint to a Hugging Face Qwen2 directory "
                                   "(config.json, safetensors, tokenizer) loadable by transformers and vLLM. A LoRA "
                                   "run's adapters are merged into the weights (or, with --adapters-only, written "
                                   "alone for PEFT).")
    p.add_argument("--checkpoint", required=True, help="training output dir or its checkpoints/ dir")
    p.add_argument("--out", required=True,
                   help="output directory: new or empty (never the checkpoint's directory or one inside it)")
    p.add_argument("--overwrite", action="store_true",
                   help="--out may hold an earlier export: replace its model files (config, safetensors, "
                        "tokenizer), keep everything else")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--best", action="store_true",
                   help="the params with the highest held-out eval/em (kept in OUTPUT/best/ when train.eval_every > 0)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="tensor dtype to write (default: the parameter dtype; float32 for --adapters-only)")
    p.add_argument("--adapters-only", action="store_true",
                   help="a LoRA run: write only its adapters, in PEFT's format (adapter_model.safetensors + "
                        "adapter_config.json), instead of the merged full weights")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("plan", help="per-device memory plan for a config (does it fit?)")
    _config_arg(p)
    p.add_argument("--device-memory-gib", type=_positive_gib, default=None,
                   help="memory of one device in GiB, > 0 (default: from the config's hardware section)")
    p.set_defaults(func=cmd_plan)

    try:
        from retrieval.cli import register
    except ImportError:  # retrieval extras missing: the other commands still work
        register = None
    if register is not None:
        register(sub)
    return parser


MULTIHOST_FLAG = "--multihost"


def _send_sigint_again() -> None:
    """SIGINT to this process in 50 ms, from a timer thread (the main thread then runs the handler)."""
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    timer.daemon = True
    timer.start()


# Inside Orbax (a checkpoint being written or waited for) a Ctrl-C is put off until it returns, for at
# most this many re-sends (50 ms apart: a minute): raised there, it broke the save's finalisation and
# the step was lost, with Orbax's traceback in the log.
_ORBAX_DEFERRALS = 1200
_deferred = [0]


def _inside(frame, codes) -> str | None:
    """Why a KeyboardInterrupt must not be raised in `frame`'s stack: "lost" (a gc callback or a
    __del__, where Python prints and drops it), "orbax" (a checkpoint in progress), else None."""
    while frame is not None:
        if frame.f_code in codes or frame.f_code.co_name == "__del__":
            return "lost"
        if f"{os.sep}orbax{os.sep}" in frame.f_code.co_filename:
            return "orbax"
        frame = frame.f_back
    return None


def _on_sigint(signum, frame) -> None:
    """Python's own SIGINT handler (raise KeyboardInterrupt), except while a gc callback or a
    __del__ runs: an exception raised there is printed as "Exception ignored" and lost, and the run
    went on (a Ctrl-C during start-up landed in JAX's _xla_gc_callback). There the signal comes again;
    so it does inside Orbax, for at most _ORBAX_DEFERRALS re-sends."""
    where = _inside(frame, {getattr(cb, "__code__", None) for cb in gc.callbacks})
    if where == "lost" or (where == "orbax" and _deferred[0] < _ORBAX_DEFERRALS):
        _deferred[0] += where == "orbax"
        _send_sigint_again()
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def _ctrl_c_never_lost():
    """_on_sigint as the SIGINT handler while the command runs (where Python's own is installed:
    a SIGINT the shell set to be ignored stays ignored)."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv=None) -> int:
    """`memsearcher-jax [--multihost] COMMAND ...`. With --multihost (every host of a pod or a
    SLURM job runs the same command) the process first joins the job (JAX distributed, from the
    environment: TPU metadata, SLURM variables or MEMSEARCHER_* ones), then runs COMMAND.

    argv None: the process's own command line (the console script). Then no Ctrl-C is lost
    (_ctrl_c_never_lost), and an interrupted command (exit 130) ends the process at once, after its
    message, with no interpreter teardown: with threads still at work (Orbax's asynchronous
    checkpoint writer: "cannot schedule new futures after shutdown" tracebacks after a Ctrl-C in
    `pretrain`; XLA's own) it ended 12 of 13 Ctrl-C's during the warm start and 3 of 3 during
    `pretrain` in a segmentation fault (exit 139) on the machine of issue 82. The jobs close what
    they write before the interrupt reaches here (pretrain finishes its checkpoint and closes its
    log, GRPO closes its checkpoints and metrics), so the teardown has nothing left to do."""
    if argv is not None:
        return _command(list(argv))
    with _ctrl_c_never_lost():
        code = _command(sys.argv[1:])
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    return code


def _command(argv: list) -> int:
    """main's work: the command's exit status, each refusal or interrupt a one-line message."""
    if argv[:1] == [MULTIHOST_FLAG]:
        initialize_from_env()
        argv = argv[1:]
    try:
        rest, overrides = split_overrides(argv)
        parser = build_parser()
        args = parser.parse_args(rest)
        args.config_overrides = overrides
        for key, value in overrides:
            if value.startswith("--"):  # `--config.a.b --next-flag`: the flag was taken as the value
                parser.error(f"--config.{key} got {value!r} as its value: give a value (--config.{key}=VALUE)")
        args.command_argv = argv[argv.index(args.command) + 1:]  # what the manifest records to rerun it
        if overrides and not hasattr(args, "config"):
            parser.error(f"--config.* overrides are not used by '{args.command}'")
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"memsearcher-jax: config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memsearcher-jax: interrupted", file=sys.stderr)
        return 130
    except (UserInputError, FileNotFoundError, SearchFailuresError) as e:
        # Bad input (a config that cannot run, a data file, a checkpoint): the message names what
        # is wrong, and a traceback would bury it. Anything else is a bug and keeps its traceback.
        print(f"memsearcher-jax: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)


if __name__ == "__main__":
    sys.exit(main())
