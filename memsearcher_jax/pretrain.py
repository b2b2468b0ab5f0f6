"""Pretraining the reading base: `memsearcher-jax pretrain --config configs/base_tiny.py`.

Real GRPO runs start from a pretrained model that can already read; ours is tiny and trained
here. This job builds the reading vocabulary (`data.vocab`), initialises a Qwen2-architecture
model, trains it on the reading curriculum (`data.curriculum`) with masked next-token loss,
probes how often it copies the right value for names it never saw, and exports a Hugging Face
directory: bf16 safetensors, tokenizer, `reading_vocab.json`, and `base_manifest.json` (the
command, seed, steps, probe accuracy, and every file's size and sha256).

The run is resumable: params, optimizer state and step are checkpointed (Orbax, atomic) every
`train.save_every` steps, and the curriculum's rows depend only on (seed, step).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import queue
import shlex
import sys
import threading
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from safetensors import safe_open

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.data.curriculum import Curriculum, CurriculumConfig, probe_items
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.vocab import NAME_TYPES, ReadingVocab, build_vocab
from memsearcher_jax.experiment import TrainConfigError
from memsearcher_jax.models import ModelConfig, Qwen2, from_pretrained, save_pretrained
from memsearcher_jax.rl.learner import OptimConfig
from memsearcher_jax.rl.sft import SFTConfig, SFTTrainer, build_rows
from memsearcher_jax.rl.trainer import MetricsWriter

BASE_MANIFEST = "base_manifest.json"


def _log(msg: str):
    print(f"[pretrain {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def base_model_config(cfg: ml_collections.ConfigDict, vocab_size: int, eos_id: int, pad_id: int) -> ModelConfig:
    m = cfg.model
    return ModelConfig(vocab_size=-(-vocab_size // 64) * 64, hidden_size=m.hidden_size,
                       intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
                       num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, rope_theta=m.rope_theta,
                       tie_word_embeddings=True, max_position_embeddings=4096, bos_token_id=pad_id,
                       eos_token_id=eos_id)


def name_groups(vocab: ReadingVocab) -> list[list[int]]:
    """Token ids of every name, one group per type (pretrain and reserved pools together)."""
    return [[vocab.ids[n] for pool in ("pretrain", "reserved") for n in vocab.names[kind][pool]]
            for kind in NAME_TYPES]


def value_groups(vocab: ReadingVocab) -> list[list[int]]:
    """Token ids of the attribute values, one group per kind (years, occupations, ...)."""
    return [[vocab.ids[v] for v in values] for values in vocab.values.values()]


def set_codes(embed: np.ndarray, groups: list[list[int]], seed: int) -> np.ndarray:
    """Each row of a group becomes the group's current mean + its own random code of norm ~1
    (std 1/sqrt(d) per entry, the scale trained embeddings reach). With tied updates the mean
    is then learnt for the group and the codes stay fixed: every member looks alike but for
    its code, which is what copying reads."""
    emb = np.asarray(embed, np.float32).copy()
    rng = np.random.default_rng(seed)
    d = emb.shape[1]
    for ids in groups:
        emb[ids] = emb[ids].mean(axis=0) + rng.normal(0.0, 1.0 / np.sqrt(d), (len(ids), d))
    return emb


# ----------------------------------------------------------------------------- the probe

@functools.partial(jax.jit, static_argnums=0)
def _last_token_argmax(graphdef, params, ids, mask):
    logits = nnx.merge(graphdef, params)(ids, attention_mask=mask)
    return jnp.argmax(logits[:, -1, :], axis=-1)


def reading_probe(model: Qwen2, items: list[tuple[list[int], int, str]], pad_id: int, batch: int = 64) -> dict:
    """Greedy accuracy of the answer token (the value after `\\boxed{`) on probe items.

    Items are left-padded to one length, so the probe compiles once. Returns {"accuracy",
    "by_relation": {relation: accuracy}, "n"}.
    """
    graphdef, params = nnx.split(model, nnx.Param)
    width = max(len(ids) for ids, _, _ in items)
    width = -(-width // 64) * 64
    hits, rel_hits = [], {}
    for s in range(0, len(items), batch):
        chunk = items[s:s + batch]
        ids = np.full((batch, width), pad_id, np.int32)
        mask = np.zeros((batch, width), bool)
        for i, (seq, _, _) in enumerate(chunk):
            ids[i, width - len(seq):] = seq
            mask[i, width - len(seq):] = True
        mask[len(chunk):, -1] = True  # filler rows: one real token, ignored
        pred = np.asarray(jax.device_get(_last_token_argmax(graphdef, params, ids, mask)))
        for i, (_, target, rel) in enumerate(chunk):
            ok = int(pred[i]) == target
            hits.append(ok)
            rel_hits.setdefault(rel, []).append(ok)
    return {"accuracy": float(np.mean(hits)), "n": len(hits),
            "by_relation": {r: float(np.mean(v)) for r, v in sorted(rel_hits.items())}}


# ----------------------------------------------------------------------------- the job

def _curriculum_config(cfg: ml_collections.ConfigDict) -> CurriculumConfig:
    c = cfg.curriculum
    return CurriculumConfig(seed=cfg.train.seed, mix=tuple((k, c[k]) for k in ("repeat", "recall", "cloze", "demo")),
                            world_entities=c.world_entities, rows_per_world=c.rows_per_world, top_n=c.top_n,
                            max_len=cfg.train.max_len)


def _optim(cfg: ml_collections.ConfigDict) -> OptimConfig:
    t = cfg.train
    return OptimConfig(learning_rate=t.learning_rate, b2=0.98, weight_decay=t.weight_decay, schedule="cosine",
                       warmup_steps=min(t.warmup, t.steps - 1), total_steps=t.steps,
                       final_lr_fraction=t.final_lr_fraction)


def validate_pretrain(cfg: ml_collections.ConfigDict) -> None:
    t = cfg.train
    problems = []
    for key in ("steps", "batch_size", "save_every", "probe_every", "probe_items"):
        if t[key] < 1:
            problems.append(f"train.{key} must be >= 1, got {t[key]}")
    if t.learning_rate <= 0:
        problems.append(f"train.learning_rate must be > 0, got {t.learning_rate}")
    if problems:
        raise TrainConfigError("invalid pretraining config:\n  - " + "\n  - ".join(problems))
    _curriculum_config(cfg)  # raises ValueError naming the field


class _Prefetch:
    """Builds the next step's rows on a thread while the current step trains."""

    def __init__(self, make, start: int, stop: int):
        self.q: queue.Queue = queue.Queue(maxsize=2)
        self.thread = threading.Thread(target=self._run, args=(make, start, stop), daemon=True)
        self.thread.start()

    def _run(self, make, start, stop):
        for step in range(start, stop):
            self.q.put((step, make(step)))

    def get(self):
        return self.q.get()


def run_pretrain(cfg: ml_collections.ConfigDict, resume: bool = True, argv: list[str] | None = None) -> dict:
    """Train (or resume) the reading base and export it; returns the summary dict."""
    validate_pretrain(cfg)
    t = cfg.train
    out = os.path.abspath(os.path.expanduser(t.output_dir))
    os.makedirs(out, exist_ok=True)
    vocab_dir = os.path.join(out, "vocab")
    if not ReadingVocab.exists(vocab_dir):
        build_vocab(vocab_dir, seed=cfg.vocab.seed, bpe_size=cfg.vocab.bpe_size)
    vocab = ReadingVocab.load(vocab_dir)
    tokenizer = load_tokenizer(vocab_dir)
    builder = PromptBuilder(tokenizer, default_top_n=cfg.curriculum.top_n, style="compact")
    mc = base_model_config(cfg, len(tokenizer), builder.eos_id, builder.pad_id)
    model = Qwen2(mc, rngs=nnx.Rngs(cfg.model.init_seed))
    tied = (name_groups(vocab) if cfg.model.tie_names else []) + (value_groups(vocab) if cfg.model.tie_values else [])
    if tied:
        model.embed[...] = jnp.asarray(set_codes(model.embed[...], tied, cfg.model.init_seed), model.embed[...].dtype)
    _log(f"model: {mc.num_params() - mc.vocab_size * mc.hidden_size:,} parameters besides the "
         f"{mc.vocab_size}x{mc.hidden_size} embedding ({sum(map(len, tied))} name/value rows as "
         f"{'a shared vector per type + a fixed code each' if tied else 'trained one by one'}); "
         f"vocabulary {len(tokenizer)}")
    sft_cfg = SFTConfig(steps=t.steps, batch_size=t.batch_size, lr=t.learning_rate, seed=t.seed,
                        warmup=min(t.warmup, t.steps), max_len=t.max_len, min_len=t.min_len, progress=False)
    trainer = SFTTrainer(model, sft_cfg, tied_rows=tied or None, optim=_optim(cfg))
    curriculum = Curriculum(vocab, builder, _curriculum_config(cfg))
    probe = probe_items(vocab, builder, t.probe_items, seed=t.seed + 1000, pool="reserved")
    probe_seen = probe_items(vocab, builder, min(256, t.probe_items), seed=t.seed + 2000, pool="pretrain")

    manager = ocp.CheckpointManager(os.path.join(out, "checkpoints"),
                                    options=ocp.CheckpointManagerOptions(max_to_keep=2))
    step = 0
    if resume and manager.latest_step() is not None:
        abstract = lambda tree: jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
        got = manager.restore(manager.latest_step(), args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract(trainer.params)),
            opt_state=ocp.args.StandardRestore(abstract(trainer.opt_state))))
        trainer.params, trainer.opt_state, step = got["params"], got["opt_state"], manager.latest_step()
        _log(f"resumed at step {step}")
        if cfg.model.recode_values_on_resume:  # a run begun without tied values switches to them
            emb = trainer.params["embed"]
            emb[...] = jnp.asarray(set_codes(emb[...], value_groups(vocab), cfg.model.init_seed + 1), emb[...].dtype)
            _log("value rows re-coded: each kind's mean + a fixed code per value, tied from now on")
    writer = MetricsWriter(os.path.join(out, "logs"), resume_step=step)
    prefetch = _Prefetch(lambda s: curriculum.rows_for_step(s, t.batch_size), step, t.steps)
    summary_path = os.path.join(out, "summary.json")
    t0, losses, last = time.time(), [], {}
    while step < t.steps:
        got_step, rows = prefetch.get()
        assert got_step == step
        sft_rows = build_rows(rows, builder.pad_id, sft_cfg.max_len)
        stats = trainer.train_step(sft_rows, np.arange(len(rows)))
        losses.append(stats["loss"])
        step += 1
        if step % t.probe_every == 0 or step == t.steps:
            res = reading_probe(trainer.model(), probe, builder.pad_id)
            seen = reading_probe(trainer.model(), probe_seen, builder.pad_id)
            last = {"loss": float(np.mean(losses)), "probe_accuracy": res["accuracy"],
                    "probe_accuracy_pretrain_names": seen["accuracy"],
                    **{f"probe/{r}": a for r, a in res["by_relation"].items()},
                    "steps_per_second": len(losses) / (time.time() - t0)}
            writer.write(step, last)
            _log(f"step {step}/{t.steps} loss {last['loss']:.3f} probe {100 * res['accuracy']:.1f}% "
                 f"(pretrain names {100 * seen['accuracy']:.1f}%) {last['steps_per_second']:.2f} steps/s")
            t0, losses = time.time(), []
        if step % t.save_every == 0 or step == t.steps:
            manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(trainer.params),
                                                       opt_state=ocp.args.StandardSave(trainer.opt_state)))
    manager.wait_until_finished()
    writer.close()
    export_dir = os.path.abspath(os.path.expanduser(t.export_dir or os.path.join(out, "base")))
    final = export_base(trainer.model(), vocab_dir, export_dir, cfg, argv, seed=t.seed, n_probe=t.probe_items,
                        history=read_history(os.path.join(out, "logs")))
    summary = {"steps": t.steps, "probe": final, "export_dir": export_dir}
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=1)
    _log(f"reading probe on reserved names: {100 * final['accuracy']:.1f}% ({final['n']} items); "
         f"base written to {export_dir}")
    return summary


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_history(log_dir: str) -> list[dict]:
    """(step, loss, probe accuracy) of every logged step, for the manifest."""
    path = os.path.join(log_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"step": r["step"], "loss": round(r["loss"], 4), "probe": round(r["probe_accuracy"], 4)} for r in rows]


def base_probe(base_dir: str, n: int = 512, seed: int = 0) -> dict:
    """The reading probe of a base directory as it is stored (bf16 weights, read in float32):
    reserved names only, the same items the pretraining run probed with (seed + 1000)."""
    vocab = ReadingVocab.load(base_dir)
    builder = PromptBuilder(load_tokenizer(base_dir), default_top_n=2, style="compact")
    items = probe_items(vocab, builder, n, seed=seed + 1000, pool="reserved")
    return reading_probe(from_pretrained(base_dir), items, builder.pad_id)


def export_base(model: Qwen2, vocab_dir: str, out_dir: str, cfg: ml_collections.ConfigDict,
                argv: list[str] | None = None, seed: int = 0, n_probe: int = 512, history: list | None = None) -> dict:
    """bf16 Hugging Face directory + base_manifest.json (command, config, the probe measured on
    the stored bf16 weights, every file's size and sha256, tensor shapes). Returns the probe."""
    save_pretrained(model, out_dir, tokenizer_dir=vocab_dir, dtype="bfloat16")
    probe = base_probe(out_dir, n_probe, seed)
    files = {}
    for name in sorted(os.listdir(out_dir)):
        if name == BASE_MANIFEST:
            continue
        path = os.path.join(out_dir, name)
        files[name] = {"bytes": os.path.getsize(path), "sha256": _sha256(path)}
    with safe_open(os.path.join(out_dir, "model.safetensors"), "np") as f:
        tensors = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    manifest = {
        "command": "memsearcher-jax pretrain " + " ".join(shlex.quote(a) for a in (argv or sys.argv[2:])),
        "date": time.strftime("%Y-%m-%d"),
        "seed": {"vocab": cfg.vocab.seed, "init": cfg.model.init_seed, "data": cfg.train.seed},
        "config": cfg.to_dict(),
        "reading_probe": probe,
        "history": history or [],
        "tensors": tensors,
        "files": files,
    }
    with open(os.path.join(out_dir, BASE_MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, default=list)
    return probe
