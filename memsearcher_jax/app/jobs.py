"""The jobs behind the CLI: training (warm start, held-out EM, GRPO, held-out EM), evaluation,
checkpoint export. Each is a thin sequence over `experiment` (what a config builds) and
`warm_start` (the supervised start before GRPO)."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from memsearcher_jax.agent.rollout import SearchFailuresError
from memsearcher_jax.app.curves import curve_table, plot_curves, read_metrics
from memsearcher_jax.app.experiment import (
    Setup,
    TrainConfigError,
    assemble_trainer,
    build_sampler,
    build_setup,
    eval_questions,
    eval_runner,
    evaluate,
    sampling_mesh,
)
from memsearcher_jax.app.validation import check_retriever, check_setup, check_training
from memsearcher_jax.app.warm_start import prepare_warm_start, warm_start
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.models import ModelConfig, Qwen2, from_pretrained, save_pretrained
from memsearcher_jax.models.hf_io import save_adapters
from memsearcher_jax.models.qwen2 import LoRAParam
from memsearcher_jax.rl.checkpoints import item_problem
from memsearcher_jax.rl.token_metrics import trajectory_token_metrics
from memsearcher_jax.rules.config_rules import check_config, settings_of
from memsearcher_jax.rules.run_dir import (
    BASE_DIR,
    BEST_DIR,
    CHECKPOINTS_DIR,
    CURVE,
    SUMMARY,
    WARMSTART_DIR,
    check_eval_out,
    enclosing_run,
    existing_parent,
    is_same_or_parent,
    marker_kind,
    prepare_eval_out,
    prepare_output_dir,
    record_config,
    release_output_dir,
    replaced,
    starts_over,
    write_json,
)
from memsearcher_jax.runtime import compile_stats
from memsearcher_jax.runtime.console import log
from memsearcher_jax.settings import Settings, WorldSettings


def held_out_em(cfg: Settings, setup: Setup, model: Qwen2) -> float:
    """Greedy held-out EM of `model` on the first train.eval_questions held-out questions, as
    the default job measures it (a sampler only)."""
    runner = eval_runner(cfg, setup, build_sampler(cfg, model, sampling_mesh(cfg)))
    return evaluate(runner, eval_questions(cfg.train, setup))["em"]


# ----------------------------------------------------------------------------- the output directory

def _read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def compile_summary(what: str, count: compile_stats.CompileCount, history: list[dict] | None = None) -> str:
    """One line: the programs `what` built (and, for GRPO steps, the last step that built one)."""
    line = (f"compiles, {what}: {count.programs} new programs, {count.compiled} compiled by XLA, "
            f"{count.from_cache} from the persistent cache, {count.seconds:.1f}s")
    if history:
        late = [i + 1 for i, m in enumerate(history) if m.get("compiles", 0)]
        line += f"; last step with a new program: {late[-1] if late else 'none'} of {len(history)} run here"
    return line


def check_resumable(trainer, out: str) -> int | None:
    """The step a run in `out` resumes from (None: it starts at 0), after checking that its
    checkpoint was written by a model of this config's shape (before anything is restored)."""
    step = trainer.checkpoints.latest_step()
    if step is None:
        return None
    try:
        meta = trainer.checkpoints.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # noqa: BLE001 - any unreadable metadata is reported the same way
        trainer.close()
        raise UserInputError(f"the checkpoint of step {step} in {out}/checkpoints cannot be read ({type(e).__name__}: "
                             f"{e}); it may be truncated: remove {out}/checkpoints/{step} to resume from the step "
                             "before, or start over with --fresh") from None
    now = dataclasses.asdict(trainer.learner.model().config)
    saved = meta.get("model_config", {})
    # The compute dtype may change between runs; a shape, a layout or the adapters may not.
    differ = sorted(k for k in now if k in saved and k != "dtype" and saved[k] != now[k]
                    and not isinstance(now[k], (tuple, list)))
    if differ:
        trainer.close()
        what = ", ".join(f"{k} {saved[k]} -> {now[k]}" for k in differ[:4])
        raise UserInputError(f"{out} holds a run of another model (checkpoint step {step}: {what}): resume it with "
                             "the config it was started with, or pass --fresh, or choose another train.output_dir")
    # A restore that fails part-way leaves Orbax's other reads to print tracebacks at exit: check first.
    step_dir = os.path.join(str(trainer.checkpoints.directory), str(step))
    items = {"params": trainer.learner.params, "opt_state": trainer.learner.opt_state}
    problem = next(filter(None, (item_problem(step_dir, name, tree) for name, tree in items.items())), None)
    if problem:
        trainer.close()
        raise UserInputError(f"checkpoint step {step} in {out}/checkpoints cannot be restored ({problem}): it is "
                             f"damaged (a full disk, a half copy) or of another model: remove {step_dir} to resume "
                             "from the step before, or start over with --fresh")
    return step


def run_grpo(trainer, step: int | None) -> None:
    """trainer.train() as the CLI runs it: says where it resumes (`step`, from check_resumable),
    stops on Ctrl-C or a failing retriever with one line saying what is kept (the checkpoints
    are never removed)."""
    if step is not None:
        log(f"resuming from step {step}")
    try:
        trainer.train()
    except KeyboardInterrupt:
        kept = trainer.checkpoints.latest_step()
        raise RunInterrupted(f"interrupted at step {trainer.step + 1}; "
                             f"{f'checkpoint {kept} kept' if kept is not None else 'no checkpoint yet'}; "
                             "resume with the same command") from None
    except SearchFailuresError as e:
        kept = trainer.checkpoints.latest_step()
        raise UserInputError(f"stopped at step {trainer.step + 1}: {e}. "
                             f"{f'Checkpoint {kept} is kept' if kept is not None else 'No checkpoint yet'}: fix the "
                             "retriever, then resume with the same command") from None
    finally:
        trainer.close()  # its checkpoints are written; no thread is left to the interpreter's exit


class RunInterrupted(UserInputError):
    """Ctrl-C during a run: the message says what was kept and how to resume."""

    exit_code = 130  # the shell's code for a run ended by SIGINT


def train_job(cfg: Settings | ml_collections.ConfigDict, resume: bool = True) -> dict:
    """Warm start (if configured), held-out EM before, GRPO, held-out EM after; the learning
    curve as a table and learning_curve.png in the output dir. Returns summary.json's dict.
    `cfg`: the run's Settings, or a library user's ConfigDict (converted here, once)."""
    cfg = settings_of(cfg)  # the run's settings, once: every key, the config's or its default (settings/)
    out = check_training(cfg, fresh=not resume)
    # An earlier attempt with other settings and no checkpoint (it stopped early): nothing to resume.
    changed = starts_over(cfg, out) if resume else []
    fresh = not resume or bool(changed)
    setup = build_setup(cfg)
    check_setup(cfg, setup)
    warm = prepare_warm_start(cfg, setup, out, fresh=fresh)  # the demonstrator can still fail: first
    if changed:
        log(f"{out} holds no checkpoint of its earlier attempt, whose settings differ ({changed[0][0]} "
            f"{changed[0][1]!r} -> {changed[0][2]!r}{f' and {len(changed) - 1} more' if len(changed) > 1 else ''}): "
            "starting over there")
    prepare_output_dir(out, fresh=fresh)  # every check done: only now touch the disk
    if jax.process_index() == 0:
        record_config(cfg, out)
    log(f"output dir {out}")
    # Before anything compiles: a second run of the job loads its programs instead of compiling them.
    cache_dir = compile_stats.enable_persistent_cache(cfg.train.compilation_cache_dir)
    job_start = compile_stats.snapshot()
    log(f"compilation cache: {cache_dir or 'off'}")
    log(f"{len(setup.train_questions)} train / {len(setup.eval_questions)} held-out questions")
    ws = warm_start(cfg, setup, os.path.join(out, WARMSTART_DIR), warm) if cfg.sft.steps > 0 else None
    trainer = assemble_trainer(cfg, setup, source=ws)  # GRPO starts from the warm start's weights
    resume_step = check_resumable(trainer, out)  # before any evaluation or compile
    eval_qs = eval_questions(cfg.train, setup)
    n_eval = len(eval_qs)
    summary_path = os.path.join(out, SUMMARY)
    summary = _read_json(summary_path) if os.path.exists(summary_path) else {}
    if n_eval and "em_before" not in summary:
        log(f"evaluating {n_eval} held-out questions before GRPO (greedy)")
        before = evaluate(eval_runner(cfg, setup, trainer.sampler), eval_qs)
        summary.update(em_before=before["em"], f1_before=before["f1"], format_ok_before=before["format_ok"])
        write_json(summary_path, summary)
    log(f"GRPO: {cfg.train.steps} steps of {cfg.rl.batch_questions} questions x {cfg.rl.group_size} samples")
    t0, grpo_start = time.perf_counter(), compile_stats.snapshot()
    run_grpo(trainer, resume_step)
    summary["grpo_seconds"] = summary.get("grpo_seconds", 0.0) + time.perf_counter() - t0
    write_json(summary_path, summary)  # kept for a later rerun whether or not an evaluation follows
    log(compile_summary("GRPO", compile_stats.snapshot() - grpo_start))
    if n_eval:
        log(f"evaluating {n_eval} held-out questions after GRPO (greedy)")
        after = evaluate(eval_runner(cfg, setup, trainer.sampler), eval_qs)
        summary.update(em_after=after["em"], f1_after=after["f1"], format_ok_after=after["format_ok"],
                       turns_after=after["turns"], steps=trainer.step)
        write_json(summary_path, summary)
    log(compile_summary("whole job", compile_stats.snapshot() - job_start))
    metrics = read_metrics(out)
    print("\nlearning curve (training trajectories, temperature "
          f"{cfg.agent.temperature}):\n{curve_table(metrics)}", flush=True)
    if metrics:
        with replaced(os.path.join(out, CURVE)) as png:
            plot_curves(metrics, png, summary.get("em_before"), summary.get("em_after"))
        log(f"learning curve plotted to {os.path.join(out, CURVE)}")
    if n_eval:
        print(f"held-out EM: before {100 * summary['em_before']:.1f} after {100 * summary['em_after']:.1f} "
              f"gain {100 * (summary['em_after'] - summary['em_before']):.1f}", flush=True)
    release_output_dir(out)
    return summary


# ----------------------------------------------------------------------------- checkpoints -> HF

def _refuse_pretraining_run(path: str) -> None:
    """A pretraining run's checkpoints (`memsearcher-jax pretrain`) hold no model config: its model
    is the export it writes when it finishes (base/, or its train.export_dir): say so."""
    run = os.path.dirname(path) if os.path.basename(path) in (CHECKPOINTS_DIR, BEST_DIR) else path
    if marker_kind(run) != "pretrain":
        return
    try:
        export = _read_json(os.path.join(run, SUMMARY))["export_dir"]
    except (OSError, ValueError, KeyError, TypeError):
        export = os.path.join(run, BASE_DIR)
    done = os.path.isfile(os.path.join(export, "config.json"))
    raise UserInputError(f"--checkpoint {path} is a pretraining run (memsearcher-jax pretrain), not a training run: "
                         f"its model is its export, {export}, a Hugging Face directory"
                         + (": give that as --model (eval) or model.source (train)" if done else
                            ", written when the run finishes (not yet): rerun the same pretrain command to finish it"))


def _checkpoint_manager(path: str, best: bool = False):
    path = os.path.abspath(os.path.expanduser(path))
    _refuse_pretraining_run(path)
    sub = BEST_DIR if best else CHECKPOINTS_DIR
    if os.path.isdir(os.path.join(path, sub)):
        path = os.path.join(path, sub)
    elif best:
        raise FileNotFoundError(f"no best/ checkpoint in {path}: it is written when train.eval_every > 0")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no checkpoint directory at {path}")
    mngr = ocp.CheckpointManager(path)
    if mngr.latest_step() is None:
        raise FileNotFoundError(f"{path} holds no checkpoint")
    return mngr


def _restore(mngr, step: int, **items):
    """mngr.restore of `items` at `step`; a checkpoint that cannot be read (truncated, half
    copied) is a message naming its directory and step instead of a deep Orbax traceback."""
    try:
        return mngr.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # noqa: BLE001 - Orbax/TensorStore raise many types for a damaged file
        where = os.path.join(str(mngr.directory), str(step))
        raise UserInputError(f"checkpoint step {step} in {where} cannot be read ({type(e).__name__}: "
                             f"{str(e)[:300]}): it is damaged or incomplete; use another --step") from None


def checked_checkpoint(checkpoint: str, step: int | None = None, best: bool = False,
                       fix: str = "use another --step") -> tuple:
    """(manager, step, metadata) of a training checkpoint (latest step by default; best=True: in
    best/), after checking that its params can be restored into the shapes its metadata names, as
    a resumed `train` checks them (rl/checkpoints.py): a restore that fails part-way leaves Orbax's
    reads to print asyncio tracebacks at exit, after the message. `fix`: what the user can do."""
    mngr = _checkpoint_manager(checkpoint, best)
    step = mngr.latest_step() if step is None else step
    if step not in mngr.all_steps():
        raise FileNotFoundError(f"checkpoint step {step} not found; available: {sorted(mngr.all_steps())}")
    meta = _restore(mngr, step, meta=ocp.args.JsonRestore())["meta"]
    mc = ModelConfig(**meta["model_config"])
    model = nnx.eval_shape(lambda: Qwen2(mc, rngs=nnx.Rngs(0)))
    saved = nnx.split(model, LoRAParam, nnx.Param)[1] if mc.lora else nnx.split(model, nnx.Param)[1]
    problem = item_problem(os.path.join(str(mngr.directory), str(step)), "params", saved)
    if problem:
        raise UserInputError(f"checkpoint step {step} in {mngr.directory} cannot be restored ({problem}): it is "
                             f"damaged (a full disk, a half copy) or incomplete; {fix}")
    return mngr, step, meta


def restore_policy(checkpoint: str, step: int | None = None, best: bool = False) -> tuple[Qwen2, dict]:
    """A Qwen2 with the params of a training checkpoint (latest step by default; best=True: the
    params with the highest eval/em, kept in best/), and its metadata.

    A LoRA run's checkpoint holds the adapters alone: the frozen base is read from the
    Hugging Face directory its metadata names (`lora_base`) and the adapters are put on it."""
    mngr, step, meta = checked_checkpoint(checkpoint, step, best)
    mc = ModelConfig(**meta["model_config"])
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    if mc.lora:
        base_dir = meta.get("lora_base")
        if not base_dir or not os.path.isfile(os.path.join(base_dir, "config.json")):
            raise FileNotFoundError(f"{checkpoint} holds LoRA adapters whose base model directory {base_dir!r} "
                                    "is missing (its metadata's lora_base)")
        fields = {f: getattr(mc, f) for f in ("scan_layers", "remat", "lora_rank", "lora_alpha", "lora_targets")}
        base = from_pretrained(base_dir, dtype=mc.dtype, param_dtype=mc.param_dtype, **fields)
        if base.config != mc:
            raise ValueError(f"the base in {base_dir} does not match the checkpoint's model config: "
                             f"{base.config} vs {mc}")
        graphdef, adapters, frozen = nnx.split(base, LoRAParam, nnx.Param)
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), adapters)
        adapters = _restore(mngr, step, params=ocp.args.StandardRestore(target))["params"]
        return nnx.merge(graphdef, adapters, frozen), meta
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Qwen2(mc, rngs=nnx.Rngs(0))), nnx.Param)
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract)
    params = _restore(mngr, step, params=ocp.args.StandardRestore(target))["params"]
    return nnx.merge(graphdef, params), meta


def check_export_dir(checkpoint: str, out: str, overwrite: bool) -> None:
    """Refuse, before any checkpoint is read, an export that would write over the user's files:
    an --out that is a file, inside the checkpoint's directory, or non-empty without --overwrite."""
    out_abs = os.path.abspath(os.path.expanduser(out))
    if os.path.exists(out_abs) and not os.path.isdir(out_abs):
        raise UserInputError(f"--out {out} is a file, not a directory: give a new directory")
    if not os.path.isdir(existing_parent(out_abs)):
        raise UserInputError(f"--out {out}: {existing_parent(out_abs)} is a file, not a directory: give a new "
                             "directory")
    run_dir = os.path.abspath(os.path.expanduser(checkpoint))
    if os.path.basename(run_dir.rstrip(os.sep)) in (CHECKPOINTS_DIR, BEST_DIR):
        run_dir = os.path.dirname(run_dir.rstrip(os.sep))
    if is_same_or_parent(run_dir, out_abs) or is_same_or_parent(out_abs, run_dir):
        raise UserInputError(f"--out {out} is (or holds, or lies inside) the checkpoint directory {checkpoint}: "
                             "give a directory outside the training run")
    if enclosing_run(out_abs) is not None:  # another run's directory holds only what that run writes
        raise UserInputError(f"--out {out} lies inside the run directory {enclosing_run(out_abs)} (it has a run "
                             "marker, .memsearcher-run): give a directory outside any training run")
    if os.path.isdir(out_abs) and os.listdir(out_abs) and not overwrite:
        raise UserInputError(f"--out {out} is not empty (it holds {sorted(os.listdir(out_abs))[0]}, ...): give a "
                             "new directory, or --overwrite to replace only its model files")


def export_checkpoint(checkpoint: str, out: str, step: int | None = None, dtype: str | None = None,
                      best: bool = False, adapters_only: bool = False, overwrite: bool = False) -> str:
    """A Hugging Face model directory from a checkpoint (a LoRA run's adapters merged into the
    weights), or with adapters_only its LoRA adapters in PEFT's format. `out` must be new or
    empty unless overwrite (then only its model files are replaced)."""
    check_export_dir(checkpoint, out, overwrite)
    model, meta = restore_policy(checkpoint, step, best)
    if adapters_only:
        if not model.config.lora:
            raise TrainConfigError(f"--adapters-only: {checkpoint} is a full fine-tuning checkpoint (no LoRA adapters)")
        return save_adapters(model, out, base_model_name_or_path=meta.get("lora_base"), dtype=dtype)
    tok = meta.get("tokenizer_dir")
    return save_pretrained(model, out, tokenizer_dir=tok if tok and os.path.isdir(tok) else None, dtype=dtype)


# ----------------------------------------------------------------------------- evaluation job

def _context_table(trajs) -> list[tuple[int, float, int, int]]:
    by_turn: dict[int, list[int]] = {}
    for t in trajs:
        for i, n in enumerate(t.context_tokens):
            by_turn.setdefault(i, []).append(n)
    return [(i + 1, float(np.mean(v)), int(np.max(v)), len(v)) for i, v in sorted(by_turn.items())]


def check_eval_args(world: WorldSettings, checkpoint: str | None, split: str | None, limit: int) -> None:
    """What `eval` can refuse in a second: a negative --limit, an unknown synthetic --split, a
    checkpoint that is not there or is damaged (before any world is built or model loaded)."""
    if limit < 0:
        raise TrainConfigError(f"--limit {limit}: must be >= 0 (0: every question)")
    if world.enabled and split not in (None, "heldout", "all", "train"):
        raise TrainConfigError(f"--split {split!r}: the synthetic world has the splits 'heldout' and 'train'")
    if checkpoint:  # there, and restorable
        checked_checkpoint(checkpoint, fix="eval reads the latest step: remove that step to evaluate the one before")


def run_eval(cfg: Settings | ml_collections.ConfigDict, checkpoint: str | None = None, model_dir: str | None = None,
             split: str | None = None, limit: int = 0, out: str = "", workflow: str | None = None,
             objectives: int | None = None) -> dict:
    """Greedy evaluation: EM/F1 per benchmark and their average, per-turn context lengths, JSONL.
    objectives: questions asked at once (overrides world.objectives; EM and F1 are then per objective)."""
    if bool(model_dir) == bool(checkpoint):
        raise TrainConfigError("memsearcher-jax eval: give exactly one of --checkpoint or --model")
    cfg = settings_of(cfg, training=False)  # the run's settings, once (a library user's ConfigDict converted here)
    if model_dir:
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            raise TrainConfigError(f"--model {model_dir}: not a Hugging Face model directory (no config.json)")
        # Its tokenizer too, unless data.tokenizer_dir or the world says otherwise.
        cfg = cfg.with_values({"model.source": model_dir})
    if objectives is not None:
        cfg = cfg.with_values({"world.objectives": objectives})
    check_eval_args(cfg.world, checkpoint, split, limit)
    check_eval_out(out, checkpoint or model_dir)
    check_config(cfg, training=False)
    check_retriever(cfg.retrieval)  # the network probe, after every local check
    setup = build_setup(cfg, training=False)
    check_setup(cfg, setup, training=False, workflow=workflow, model_dir=model_dir)
    if model_dir:
        policy = from_pretrained(model_dir, dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype)
    else:
        policy, _ = restore_policy(checkpoint)
    # Only a sampler: no learner, reference copy or optimizer state, and no training-memory check.
    runner = eval_runner(cfg, setup, build_sampler(cfg, policy, sampling_mesh(cfg)), workflow)
    benchmarks = dict(setup.eval_sets)
    if cfg.world.enabled:
        if split == "train":
            benchmarks = {"synthetic-train": setup.train_questions}
    else:
        for name, why in setup.missing_eval_sets.items():
            if split in (None, "all", name):
                print(f"skipping {name}: {why}", file=sys.stderr)
        if split not in (None, "all", "heldout"):
            if split not in benchmarks:
                raise TrainConfigError(f"--split {split!r}: no such evaluation set under data.eval_path="
                                       f"{cfg.data.eval_path} (found: {', '.join(benchmarks)})")
            benchmarks = {split: benchmarks[split]}
    rows = []
    all_trajs = []
    for name, qs in benchmarks.items():
        if limit:
            qs = qs[:limit]
        res = evaluate(runner, qs)
        rows.append((name, len(qs), 100 * res["em"], 100 * res["f1"]))
        for t, r in zip(res["trajectories"], res["results"]):
            all_trajs.append((name, t, r))
    print(f"{'benchmark':<24}{'n':>6}{'EM':>8}{'F1':>8}")
    for name, n, em, f1 in rows:
        print(f"{name:<24}{n:>6}{em:>8.1f}{f1:>8.1f}")
    if rows:
        print(f"{'average':<24}{sum(r[1] for r in rows):>6}{np.mean([r[2] for r in rows]):>8.1f}"
              f"{np.mean([r[3] for r in rows]):>8.1f}")
    table = _context_table([t for _, t, _ in all_trajs])
    print(f"\n{'turn':>4}{'mean prompt tokens':>20}{'max':>8}{'n':>6}")
    for turn, mean, mx, n in table:
        print(f"{turn:>4}{mean:>20.1f}{mx:>8}{n:>6}")
    tokens = {k: v for k, v in trajectory_token_metrics([t for _, t, _ in all_trajs]).items()
              if k != "prompt_tokens_by_turn"}
    print(f"peak tokens per question: mean {tokens['peak_tokens']:.1f}, max {tokens['peak_tokens_max']:.0f}; "
          f"tokens processed per question {tokens['tokens_per_question']:.1f}; searches {tokens['searches']:.2f}")
    if out:
        paths = prepare_eval_out(out, checkpoint or model_dir)
        # Each file written beside itself and renamed over it: a link in its place is never written through.
        with replaced(paths["trajectories.jsonl"]) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for name, t, r in all_trajs:
                f.write(json.dumps({
                    "benchmark": name, "question": t.question, "golds": t.golds, "answer": r.answer, "em": r.em,
                    "f1": r.f1, "end_reason": t.end_reason, "memories": t.memories,
                    "context_tokens": t.context_tokens,
                    "conversations": [setup.builder.decode(c.prompt_ids + c.response_ids)
                                      for c in t.conversations]}) + "\n")
        write_json(paths["results.json"], {"benchmarks": rows, "context_by_turn": table, "tokens": tokens})
    return {"benchmarks": rows, "context_by_turn": table, "tokens": tokens}
