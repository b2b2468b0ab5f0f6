"""The pretraining run: `memsearcher-jax pretrain --config configs/base_v8.py`.

Builds the reading vocabulary (`data.vocab`), initialises the model (`model_init.py`), trains it on
the phases' curriculum (`phases.py`, `curriculum.py`, `batches.py`) with masked next-token loss,
probes how often it copies the right value for names it never saw (`probes.py`), and exports the
base (`export.py`).

The run is resumable: params, optimizer state and step are checkpointed (Orbax, atomic) every
`train.save_every` steps, and the curriculum's rows depend only on (seed, step). A checkpoint holds
no config: resuming takes the config given, so it must be the run's (the vocabulary settings are
checked against the run's vocab/).
"""
from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.vocab import ReadingVocab, build_vocab, value_groups
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.models import Qwen2
from memsearcher_jax.pretrain.batches import BatchMaker, _PoolPrefetch, _Prefetch, sft_config
from memsearcher_jax.pretrain.checks import check_base_export_dir, check_vocab_settings, validate_pretrain
from memsearcher_jax.pretrain.export import export_base, read_history
from memsearcher_jax.pretrain.model_init import init_model, model_summary, set_codes
from memsearcher_jax.pretrain.phases import optim_config
from memsearcher_jax.pretrain.probes import (
    CHECK_SEED,
    SIDE_SETS,
    copy_probe_items,
    pair_report,
    probe_items,
    probe_report,
    probe_sets,
    reading_probe,
)
from memsearcher_jax.rl.checkpoints import item_problem
from memsearcher_jax.rl.sft import SFTTrainer
from memsearcher_jax.rl.trainer import MetricsWriter
from memsearcher_jax.rules.run_dir import (
    BASE_DIR,
    CHECKPOINTS_DIR,
    LOG_DIR,
    PRETRAIN_ENTRIES,
    SUMMARY,
    VOCAB_DIR,
    check_cache_dir,
    check_output_dir,
    output_dir_path,
    prepare_output_dir,
    release_output_dir,
    write_json,
)
from memsearcher_jax.runtime import compile_stats
from memsearcher_jax.runtime.console import log


def _log(msg: str):
    log(msg, "pretrain")


def _readable(read, ckpt_dir: str, step: int, fix: str):
    """read(): a checkpoint written by a model of another shape, or a truncated one, is one line
    naming it (Orbax and TensorStore raise many types, with a hundred lines of traceback)."""
    try:
        return read()
    except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is reported the same way
        detail = (str(e).strip().splitlines() or [""])[0][:200]
        raise UserInputError(f"checkpoint {step} in {ckpt_dir} cannot be read as this config's model "
                             f"({type(e).__name__}: {detail}): it was written by a model of another shape (model.*) "
                             f"or is truncated; {fix}") from None


def _check_checkpoint(items: dict, ckpt_dir: str, step: int, fix: str) -> None:
    """Refuses checkpoint `step` unless each of `items` ({name: live tree}) can be restored into
    its tree's shapes, checked as a resumed `train` checks (rl/checkpoints.py), before any restore:
    one that fails part-way leaves Orbax's reads to print asyncio tracebacks at the interpreter's
    exit, after the message."""
    step_dir = os.path.join(ckpt_dir, str(step))
    problem = next(filter(None, (item_problem(step_dir, name, tree) for name, tree in items.items())), None)
    if problem:
        raise UserInputError(f"checkpoint {step} in {ckpt_dir} cannot be restored ({problem}): it is damaged (a full "
                             f"disk, a half copy) or was written by a model of another shape (model.*): {fix}")


def _restore(manager, trainer: SFTTrainer, cfg: ml_collections.ConfigDict, vocab: ReadingVocab) -> int:
    """Loads the latest checkpoint into the trainer; returns its step (0 if none)."""
    if manager.latest_step() is None:
        return 0
    abstract = lambda tree: jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    fix = "resume with the config the run was started with, or pass --fresh to start over"
    try:
        _check_checkpoint({"params": trainer.params, "opt_state": trainer.opt_state}, str(manager.directory),
                          manager.latest_step(), fix)
        got = _readable(lambda: manager.restore(manager.latest_step(), args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract(trainer.params)),
            opt_state=ocp.args.StandardRestore(abstract(trainer.opt_state)))),
            str(manager.directory), manager.latest_step(), fix)
    except UserInputError:
        manager.close()  # its threads would print asyncio errors at exit
        raise
    trainer.params, trainer.opt_state, step = got["params"], got["opt_state"], manager.latest_step()
    _log(f"resumed at step {step}")
    if cfg.model.recode_values_on_resume:  # a run begun without tied values switches to them
        emb = trainer.params["embed"]
        emb[...] = jnp.asarray(set_codes(emb[...], value_groups(vocab), cfg.model.init_seed + 1), emb[...].dtype)
        _log("value rows re-coded: each kind's mean + a fixed code per value, tied from now on")
    return step


def _progress_metrics(model: Qwen2, sets: dict, seen: list, pad_id: int, copy: list | None = None) -> dict:
    """The progress probe as logged: 2 passages (probe_accuracy, by relation), the longer
    contexts, the multi-objective items, 2 passages over pretrain names, and the copy items
    (`copy_probe_items`: the induction skill reading rests on)."""
    rep = probe_report(model, sets, pad_id)
    two = rep["by_length"]["2"]
    out = {"probe_accuracy": two["accuracy"], "probe_all_lengths": rep["accuracy"],
           "probe_worst_relation": rep["worst_relation"],
           "probe_accuracy_pretrain_names": reading_probe(model, seen, pad_id)["accuracy"],
           **{f"probe/{r}": a for r, a in two["by_relation"].items()}}
    for k, r in rep["by_length"].items():
        if k != "2":
            out[f"probe_{k}_passages"] = r["accuracy"]
            out.update({f"probe_{k}/{rel}": a for rel, a in r["by_relation"].items()})
    for k in SIDE_SETS:
        if k in rep:
            out[f"probe_{k}"] = rep[k]["accuracy"]
    if copy:
        out["probe_copy"] = reading_probe(model, copy, pad_id)["accuracy"]
    return out


def _prepare_run(cfg: ml_collections.ConfigDict, resume: bool) -> tuple[str, str]:
    """(output dir, export dir), after refusing what the run must not touch (before anything is
    removed, built or compiled), clearing the run's own entries for a fresh start, and turning on
    the persistent compilation cache (every rows x width x loss-slot shape is a program: a
    resumed run loads them instead of compiling)."""
    t = cfg.train
    out = output_dir_path(t.output_dir)
    export_dir = os.path.abspath(os.path.expanduser(t.export_dir or os.path.join(out, BASE_DIR)))
    check_output_dir(out, not resume, PRETRAIN_ENTRIES, "pretraining")
    check_base_export_dir(export_dir, out)
    check_cache_dir(t.get("compilation_cache_dir", None))
    if resume:
        check_vocab_settings(os.path.join(out, VOCAB_DIR), cfg)
    prepare_output_dir(out, not resume, PRETRAIN_ENTRIES, "pretraining")
    compile_stats.enable_persistent_cache(t.get("compilation_cache_dir", None))
    return out, export_dir


def _trainer(cfg: ml_collections.ConfigDict, vocab_dir: str) -> tuple[ReadingVocab, PromptBuilder, SFTTrainer]:
    """The run's vocabulary, its prompt builder, and the trainer over the initial model."""
    vocab = ReadingVocab.load(vocab_dir)
    tokenizer = load_tokenizer(vocab_dir)
    builder = PromptBuilder(tokenizer, default_top_n=cfg.curriculum.top_n, style="compact")
    model, tied = init_model(cfg, vocab, builder, len(tokenizer))
    _log(model_summary(model, tied, len(tokenizer)))
    return vocab, builder, SFTTrainer(model, sft_config(cfg), tied_rows=tied or None, optim=optim_config(cfg))


def checkpoint_model(cfg: ml_collections.ConfigDict, step: int = 0) -> tuple[int, ReadingVocab, PromptBuilder, Qwen2]:
    """(step, vocabulary, prompt builder, model) of checkpoint `step` (0: the latest) of the run in
    train.output_dir. Reads the params and nothing else, and writes nothing, so the run may still
    be training."""
    validate_pretrain(cfg)
    out = output_dir_path(cfg.train.output_dir)
    vocab_dir, ckpt_dir = os.path.join(out, VOCAB_DIR), os.path.join(out, CHECKPOINTS_DIR)
    # Finished checkpoints only: orbax writes a step under a temporary name and renames it when done.
    steps = sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit()) if os.path.isdir(ckpt_dir) else []
    if not ReadingVocab.exists(vocab_dir) or not steps:
        raise UserInputError(f"train.output_dir={out} holds no pretraining checkpoint (no vocab/ or no "
                             "checkpoints/STEP): point it at a pretraining run")
    step = step or steps[-1]
    if step not in steps:
        raise UserInputError(f"{ckpt_dir} has no checkpoint {step}; it has {', '.join(map(str, steps))}")
    check_vocab_settings(vocab_dir, cfg)
    vocab, builder, trainer = _trainer(cfg, vocab_dir)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, trainer.params)
    fix = "give the config the run was started with, or another --probe-step"
    _check_checkpoint({"params": trainer.params}, ckpt_dir, step, fix)  # the one item read here
    # A bare checkpointer on the params item: a CheckpointManager here could tidy the running run's files.
    trainer.params = _readable(lambda: ocp.StandardCheckpointer().restore(os.path.join(ckpt_dir, str(step), "params"),
                                                                         abstract), ckpt_dir, step, fix)
    return step, vocab, builder, trainer.model()


def probe_checkpoint(cfg: ml_collections.ConfigDict, step: int = 0, n: int = 256) -> dict:
    """`checkpoint_model` on `probe_report`'s sets and on binding pairs (`pair_report`), n items a set
    and n pairs, from seed + CHECK_SEED: items neither the progress nor the final probe uses."""
    step, vocab, builder, model = checkpoint_model(cfg, step)
    seed = cfg.train.seed + CHECK_SEED
    report = probe_report(model, probe_sets(vocab, builder, n, seed=seed), builder.pad_id)
    return {"step": step, **report, "pairs": pair_report(model, vocab, builder, n, seed=seed + 97)}


class PretrainInterrupted(UserInputError):
    """Ctrl-C during pretraining: the message says what was kept and how to resume."""

    exit_code = 130  # the shell's code for a run ended by SIGINT


def run_pretrain(cfg: ml_collections.ConfigDict, resume: bool = True, argv: list[str] | None = None) -> dict:
    """Train (or resume) the reading base and export it; returns the summary dict."""
    validate_pretrain(cfg)
    t = cfg.train
    out, export_dir = _prepare_run(cfg, resume)
    vocab_dir = os.path.join(out, VOCAB_DIR)
    if not ReadingVocab.exists(vocab_dir):
        build_vocab(vocab_dir, seed=cfg.vocab.seed, bpe_size=cfg.vocab.bpe_size, wording=cfg.vocab.get("wording", "v1"))
    vocab, builder, trainer = _trainer(cfg, vocab_dir)
    # The last two checkpoints, and every keep_period-th one (a phase boundary to start from again).
    manager = ocp.CheckpointManager(os.path.join(out, CHECKPOINTS_DIR),
                                    options=ocp.CheckpointManagerOptions(max_to_keep=2,
                                                                         keep_period=t.get("keep_period", 0) or None))
    step = _restore(manager, trainer, cfg, vocab) if resume else 0  # a damaged checkpoint: refused before more work
    # Progress only; the final sets are never looked at here.
    sets = probe_sets(vocab, builder, t.probe_items, seed=t.seed)
    seen = probe_items(vocab, builder, min(256, t.probe_items), seed=t.seed + 2000, pool="pretrain")
    copy = copy_probe_items(vocab, builder, min(256, t.probe_items), seed=t.seed + 3000)
    writer = MetricsWriter(os.path.join(out, LOG_DIR), resume_step=step)
    workers = t.get("data_workers", 0)
    prefetch = (_PoolPrefetch(cfg, vocab_dir, step, t.steps, workers) if workers
                else _Prefetch(BatchMaker(cfg, vocab_dir), step, t.steps))
    try:
        t0, losses = time.time(), []
        log_every = t.get("log_every", 0) or t.probe_every
        while step < t.steps:
            got_step, batch = prefetch.get()
            assert got_step == step
            stats = trainer.train_packed(batch) if t.pack else trainer.train_step(batch, np.arange(len(batch.lengths)))
            losses.append(stats["loss"])
            step += 1
            if step % log_every == 0 and step % t.probe_every:  # a heartbeat between probes
                _log(f"step {step}/{t.steps} loss {np.mean(losses[-log_every:]):.3f} "
                     f"{(time.time() - t0) / len(losses):.3f} s/step")
            if step % t.probe_every == 0 or step == t.steps:
                progress = _progress_metrics(trainer.model(), sets, seen, builder.pad_id, copy)
                last = {"loss": float(np.mean(losses)), **progress,
                        "steps_per_second": len(losses) / (time.time() - t0)}
                writer.write(step, last)
                _log(f"step {step}/{t.steps} loss {last['loss']:.3f} probe {100 * last['probe_accuracy']:.1f}% "
                     f"(all lengths {100 * last['probe_all_lengths']:.1f}%, "
                     f"binding {100 * last.get('probe_binding', 0):.1f}%, "
                     f"multi {100 * last.get('probe_multi', 0):.1f}%, "
                     f"worst relation {100 * last['probe_worst_relation']:.1f}%, pretrain names "
                     f"{100 * last['probe_accuracy_pretrain_names']:.1f}%, copy {100 * last['probe_copy']:.1f}%) "
                     f"{last['steps_per_second']:.3f} steps/s")
                t0, losses = time.time(), []
            if step % t.save_every == 0 or step == t.steps:
                manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(trainer.params),
                                                           opt_state=ocp.args.StandardSave(trainer.opt_state)))
    except KeyboardInterrupt:  # the checkpoint being written is finished and the log closed first
        manager.wait_until_finished()
        kept = manager.latest_step()
        manager.close()
        writer.close()
        raise PretrainInterrupted(f"interrupted at step {step + 1}; "
                                  f"{f'checkpoint {kept} kept' if kept is not None else 'no checkpoint yet'}; "
                                  "resume with the same command") from None
    finally:  # an interrupted run stops its data workers at once
        prefetch.close()
    manager.wait_until_finished()
    writer.close()
    check_base_export_dir(export_dir, out)  # again: the run may have taken hours
    final = export_base(trainer.model(), vocab_dir, export_dir, cfg, argv, seed=t.seed,
                        n_probe=t.get("final_probe_items", t.probe_items),
                        history=read_history(os.path.join(out, LOG_DIR)))
    summary = {"steps": t.steps, "probe": final, "export_dir": export_dir}
    write_json(os.path.join(out, SUMMARY), summary, indent=1)
    _log(f"final probe on reserved names: {100 * final['accuracy']:.1f}% over 2/8/16 passages "
         f"(worst relation {100 * final['worst_relation']:.1f}%), multi-objective "
         f"{100 * final['multi']['accuracy']:.1f}%; base written to {export_dir}")
    release_output_dir(out)
    return summary
