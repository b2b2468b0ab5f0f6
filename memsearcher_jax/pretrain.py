"""Pretraining the reading base: `memsearcher-jax pretrain --config configs/base_v2.py`.

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

import collections
import functools
import hashlib
import json
import multiprocessing
import os
import platform
import queue
import shlex
import signal
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

from memsearcher_jax import compile_stats
from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.data.curriculum import (
    CONTEXT_KINDS,
    KINDS,
    Curriculum,
    CurriculumConfig,
    PhasedCurriculum,
    copy_probe_items,
    multi_probe_items,
    pair_probe_items,
    probe_items,
)
from memsearcher_jax.data.synthetic import WORDINGS
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.vocab import MANIFEST as VOCAB_MANIFEST, ReadingVocab, build_vocab, name_groups, value_groups
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.experiment import TrainConfigError
from memsearcher_jax.models import ModelConfig, Qwen2, from_pretrained, save_pretrained
from memsearcher_jax.rl.learner import OptimConfig
from memsearcher_jax.rl.sft import SFTConfig, SFTTrainer, build_rows, pack_rows
from memsearcher_jax.rl.trainer import MetricsWriter
from memsearcher_jax.run_dir import PRETRAIN_ENTRIES, check_output_dir, prepare_output_dir
from memsearcher_jax.validation import cache_dir_problems, refuse

BASE_MANIFEST = "base_manifest.json"


def _log(msg: str):
    print(f"[pretrain {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def base_model_config(cfg: ml_collections.ConfigDict, vocab_size: int, eos_id: int, pad_id: int) -> ModelConfig:
    m = cfg.model
    return ModelConfig(vocab_size=-(-vocab_size // 64) * 64, hidden_size=m.hidden_size,
                       intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
                       num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, rope_theta=m.rope_theta,
                       tie_word_embeddings=True, max_position_embeddings=4096, bos_token_id=pad_id,
                       eos_token_id=eos_id, remat=bool(m.get("remat", False)),
                       train_query_block=int(m.get("train_query_block", 0)))


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


def mimetic_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray,
                      alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Mimetic initialisation of attention (Trockman & Kolter, 2023): each key kernel moves a
    fraction alpha of the way to the query kernel of its group's first head, each output kernel
    to the transpose of its group's value kernel, so W_q W_k^T and W_v W_o start near positive
    semi-definite: heads begin by attending to similar content and copying what they attend to,
    the two halves of the reading circuit. q [L, D, H, Dh], k and v [L, D, K, Dh], o [L, H, Dh, D];
    returns the new (k, o)."""
    k, o = np.array(k, np.float32), np.array(o, np.float32)
    heads, groups = q.shape[2], k.shape[2]
    per = heads // groups
    for g in range(groups):
        k[:, :, g] = (1 - alpha) * k[:, :, g] + alpha * q[:, :, g * per]
        for h in range(g * per, (g + 1) * per):
            o[:, h] = (1 - alpha) * o[:, h] + alpha * np.swapaxes(v[:, :, g], 1, 2)
    return k, o


def positional_biases(q_bias: np.ndarray, k_bias: np.ndarray, offsets: dict[int, tuple[int, ...]], strength: float,
                      rope_theta: float) -> tuple[np.ndarray, np.ndarray]:
    """Query / key biases that start heads as positional heads: in layer L, head h attends to the
    token `offsets[L][h % len]` places before it. Each rope pair i of the key bias is
    (strength, 0) and of head h's query bias strength * (cos, -sin)(d * theta_i), so the biases'
    score at distance t is strength^2 * sum_i cos(theta_i (t - d)), largest at t = d (the content
    terms start small). Reading needs such heads first (a token's neighbours moved into its own
    position) and gradient descent is slow to find them. q_bias [L, H, Dh], k_bias [L, K, Dh];
    returns new arrays, the layers not named unchanged."""
    q_bias, k_bias = np.array(q_bias, np.float32), np.array(k_bias, np.float32)
    heads, head_dim = q_bias.shape[1], q_bias.shape[2]
    half = head_dim // 2
    theta = 1.0 / (rope_theta ** (np.arange(0, head_dim, 2) / head_dim))
    for layer, deltas in offsets.items():
        k_bias[layer, :, :half], k_bias[layer, :, half:] = strength, 0.0
        for h in range(heads):
            d = deltas[h % len(deltas)]
            q_bias[layer, h, :half] = strength * np.cos(d * theta)
            q_bias[layer, h, half:] = -strength * np.sin(d * theta)
    return q_bias, k_bias


# ----------------------------------------------------------------------------- the probe

@functools.partial(jax.jit, static_argnums=(0, 4))
def _last_tokens_argmax(graphdef, params, ids, mask, n_last: int):
    logits = nnx.merge(graphdef, params)(ids, attention_mask=mask)
    return jnp.argmax(logits[:, -n_last:, :], axis=-1)


def reading_probe(model: Qwen2, items: list[tuple[list[int], int | list[int], str]], pad_id: int,
                  batch: int = 64) -> dict:
    """Greedy accuracy of the answer (the tokens after `\\boxed{`) on probe items.

    An item's target is one token id or a list of them (a multi-objective answer `a1; a2}`);
    a list is scored teacher-forced, right when every token is the argmax (= greedy decoding
    writes it all). Items are left-padded to one length, so the probe compiles once per length;
    long items go in smaller batches (the logits of a batch stay ~16K positions). Returns
    {"accuracy", "by_relation": {relation: accuracy}, "n", "hits": each item's result (`pack_hits`)}.
    """
    graphdef, params = nnx.split(model, nnx.Param)
    targets = [list(np.atleast_1d(t)) for _, t, _ in items]
    seqs = [list(ids) + t[:-1] for (ids, _, _), t in zip(items, targets)]
    n_last = max(map(len, targets))
    width = -(-max(map(len, seqs)) // 64) * 64
    batch = max(1, min(batch, 16384 // width))
    hits, rel_hits = [], {}
    for s in range(0, len(items), batch):
        ids = np.full((batch, width), pad_id, np.int32)
        mask = np.zeros((batch, width), bool)
        for i, seq in enumerate(seqs[s:s + batch]):
            ids[i, width - len(seq):] = seq
            mask[i, width - len(seq):] = True
        mask[len(seqs[s:s + batch]):, -1] = True  # filler rows: one real token, ignored
        pred = np.asarray(jax.device_get(_last_tokens_argmax(graphdef, params, ids, mask, n_last)))
        for i, (target, (_, _, rel)) in enumerate(zip(targets[s:s + batch], items[s:s + batch])):
            ok = pred[i, n_last - len(target):].tolist() == target
            hits.append(ok)
            rel_hits.setdefault(rel, []).append(ok)
    return {"accuracy": float(np.mean(hits)), "n": len(hits),
            "by_relation": {r: float(np.mean(v)) for r, v in sorted(rel_hits.items())},
            "hits": pack_hits(hits)}


def pack_hits(hits) -> str:
    """Per-item right / wrong, in item order, as hex (a manifest keeps which items a base reads, so a
    check can recompute any subset of them exactly instead of all)."""
    return np.packbits(np.asarray(hits, bool)).tobytes().hex()


def unpack_hits(packed: str, n: int) -> np.ndarray:
    """`pack_hits`'s bools back, the first n."""
    return np.unpackbits(np.frombuffer(bytes.fromhex(packed), np.uint8))[:n].astype(bool)


def pair_hits(hits: np.ndarray, relations: list[str]) -> dict:
    """`pair_probe_items`' pairs scored from their items' hits (a pair's two items next to each
    other): {"both": share of pairs with both answers right, "by_relation": {relation: that share},
    "n": pairs}."""
    hits = np.asarray(hits, bool)
    if len(hits) != len(relations) or len(hits) % 2:
        raise ValueError(f"pair_hits: {len(hits)} hits and {len(relations)} relations; need one per item, "
                         "items in pairs")
    both = hits[0::2] & hits[1::2]
    by_relation: dict[str, list[bool]] = {}
    for ok, relation in zip(both, relations[0::2]):
        by_relation.setdefault(relation, []).append(bool(ok))
    return {"both": float(both.mean()) if len(both) else 0.0, "n": int(len(both)),
            "by_relation": {r: float(np.mean(v)) for r, v in sorted(by_relation.items())}}


def pair_probe(base_dir: str, n: int = 256, seed: int = 4040) -> dict:
    """A stored base on `pair_probe_items` (reserved names): the share of two-entity contexts
    where it answers the asked relation right for both entities, overall and by relation. A
    relation read from the question's relation alone, whoever it names, scores ~0 here while
    reading about half of its single questions right (docs/experiments.md, tenth session)."""
    builder = probe_builder(base_dir)
    return pair_report(from_pretrained(base_dir), ReadingVocab.load(base_dir), builder, n, seed)


def pair_report(model: Qwen2, vocab: ReadingVocab, builder: PromptBuilder, n: int, seed: int) -> dict:
    """`pair_hits` of a model on n `pair_probe_items` pairs."""
    items = pair_probe_items(vocab, builder, n, seed=seed)
    result = reading_probe(model, items, builder.pad_id)
    return pair_hits(unpack_hits(result["hits"], len(items)), [rel for _, _, rel in items])


# Context lengths the probe reports (passages shown; 16 are ~900 tokens), and the multi-objective
# item's passages. Progress items come from seed + 1000 + ..., final items from seed + FINAL_SEED
# + ...: the final figure is measured on items nothing during pretraining looked at.
PROBE_PASSAGES = (2, 8, 16)
MULTI_PASSAGES = 4
FINAL_SEED = 500_000
# Checks of a run's checkpoints (`probe_checkpoint`) draw from seed + CHECK_SEED + ...: items neither
# the progress probe nor the final probe uses, so looking at them never chooses the shipped figure's items.
CHECK_SEED = 250_000
# Sets reported beside the lengths: multi-objective items, and 2-passage items whose other passage is
# about an entity of the subject's type (binding: matching the relation alone scores 50%).
SIDE_SETS = ("multi", "binding")


def probe_sets(vocab: ReadingVocab, builder: PromptBuilder, n: int, seed: int, final: bool = False) -> dict:
    """{"2": items, "8": items, "16": items, "multi": items, "binding": items} on reserved names. Progress sets
    (final=False) start at seed + 1000 (the 2-passage set is the one every earlier base was
    probed with); final sets at seed + FINAL_SEED, disjoint seeds."""
    base = seed + (FINAL_SEED if final else 1000)
    sets = {str(k): probe_items(vocab, builder, n, seed=base if k == 2 else base + 100 * k, n_passages=k)
            for k in PROBE_PASSAGES}
    sets["multi"] = multi_probe_items(vocab, builder, n, seed=base + 99, n_passages=MULTI_PASSAGES)
    sets["binding"] = probe_items(vocab, builder, n, seed=base + 98, n_passages=2, same_type=True)
    return sets


def probe_report(model: Qwen2, sets: dict, pad_id: int) -> dict:
    """Accuracy by context length (and by relation within each) and of the multi-objective items;
    "accuracy" is over every single-question item, "worst_relation" the lowest relation at any length."""
    by_length = {k: reading_probe(model, items, pad_id) for k, items in sets.items() if k not in SIDE_SETS}
    report = {"by_length": by_length,
              "accuracy": float(np.mean([r["accuracy"] for r in by_length.values()])),
              "worst_relation": min(a for r in by_length.values() for a in r["by_relation"].values())}
    for k in SIDE_SETS:
        if k in sets:
            report[k] = reading_probe(model, sets[k], pad_id)
    return report


# ----------------------------------------------------------------------------- the job

# Curriculum settings a phase may set besides its mix weights (the rest come from cfg.curriculum).
PHASE_SETTINGS = ("name_copy", "cloze_passages", "cloze_questions", "long_passages", "bind_entities", "recall_pairs",
                  "repeat_tokens", "demo_workflows", "demo_objectives")
# A later phase's keys that are not curriculum settings: when it starts, and its own learning rate.
LATER_PHASE_OWN = ("start", "learning_rate")
# The phases a config may add after phase 2, in order. Each is cfg.curriculum with the settings it
# names replaced (not the previous phase's: a later phase that names none is phase 2's mix again),
# from its `start`; a run extended after it ended adds the next one, so its config still reproduces
# every step from scratch.
LATER_PHASES = ("third_phase", "fourth_phase", "fifth_phase", "sixth_phase")


def _curriculum_config(cfg: ml_collections.ConfigDict, mix: ml_collections.ConfigDict,
                       max_len: int) -> CurriculumConfig:
    """A phase's curriculum: the row kinds `mix` weighs (in KINDS order; kinds it does not name
    are not drawn); each of PHASE_SETTINGS from `mix` where it sets it, else from cfg.curriculum."""
    c = cfg.curriculum
    settings = {}
    for key in PHASE_SETTINGS:
        source = mix if key in mix else c
        if key in source:
            default = getattr(CurriculumConfig, key)  # the field's type, from its default
            settings[key] = tuple(source[key]) if isinstance(default, tuple) else type(default)(source[key])
    return CurriculumConfig(seed=cfg.train.seed, mix=tuple((k, mix[k]) for k in KINDS if k in mix),
                            world_entities=c.world_entities, rows_per_world=c.rows_per_world, top_n=c.top_n,
                            max_len=max_len, **settings)


def phase_configs(cfg: ml_collections.ConfigDict) -> list[tuple[int, CurriculumConfig, int]]:
    """[(first step, curriculum, batch size)]: an optional `first_phase` (its own mix, max_len
    and batch_size, steps 0..first_phase.steps), then cfg.curriculum at train.max_len and
    train.batch_size, and the optional LATER_PHASES (`third_phase`, ...), each from its `start` step:
    cfg.curriculum with the keys it sets (mix weights, PHASE_SETTINGS) replaced, same length and batch
    (e.g. a recipe change made during a run, recorded so the config still reproduces it from scratch);
    a phase's `learning_rate`, if set, is a constant rate from its start (`_optim`)."""
    t, first = cfg.train, cfg.get("first_phase")
    phases = [(0, _curriculum_config(cfg, cfg.curriculum, t.max_len), t.batch_size)]
    if first is not None and first.steps > 0:
        phases = [(0, _curriculum_config(cfg, first, first.max_len), first.get("batch_size", t.batch_size)),
                  (first.steps, phases[0][1], t.batch_size)]
    for _, later in _later_phases(cfg):
        merged = ml_collections.ConfigDict(cfg.curriculum.to_dict())
        merged.update({k: v for k, v in later.items() if k not in LATER_PHASE_OWN})
        phases.append((later.start, _curriculum_config(cfg, merged, t.max_len), t.batch_size))
    return phases


def phase_records(cfg: ml_collections.ConfigDict) -> list[dict]:
    """Every phase as the manifest records it: steps, curriculum mix, max_len, batch size, learning
    rate (one warm-up + cosine schedule runs over all phases; its value where each phase begins and ends)."""
    lr = _optim(cfg).schedule_fn()
    phases = phase_configs(cfg)
    ends = [p[0] for p in phases[1:]] + [cfg.train.steps]
    rows = "one per padded row"
    if cfg.train.pack:
        rows = "packed several to a sequence (the bucket of the step's longest row)"
    demos = lambda cur: ({"demo_episodes": {"workflows": list(cur.demo_workflows),
                                            "objectives": list(cur.demo_objectives),
                                            "shares": "equal, by episode"}}
                         if dict(cur.mix).get("demo", 0) > 0 else {})
    copy = lambda cur: {"name_copy": cur.name_copy} if cur.name_copy else {}
    floor_at = decay_steps(cfg)
    kinds = lambda cur: {k for k, w in cur.mix if w > 0}
    later = _later_rates(cfg)
    floor_held = floor_at < min([at for at, _ in later] + [cfg.train.steps])   # the floor holds a while
    schedule = (f"cosine to {cfg.train.final_lr_fraction:g} x peak at step {floor_at}"
                + (", constant after" if floor_held else "")
                + "".join(f"; {rate:g} constant from step {at}" for at, rate in later))
    contexts = lambda cur: ({"contexts": {"cloze_passages": list(cur.cloze_passages),
                                          "long_passages": list(cur.long_passages),
                                          "bind_entities": list(cur.bind_entities),
                                          "questions_per_row": cur.cloze_questions}}
                            if kinds(cur) & set(CONTEXT_KINDS) else {})
    return [{"steps": f"{start}-{end}", "curriculum": dict(cur.mix), **demos(cur), **copy(cur), **contexts(cur),
             "max_len": cur.max_len,
             "batch_size": batch, "rows": rows,
             "learning_rate": {"start": round(float(lr(start)), 8), "end": round(float(lr(end)), 8),
                               "peak": cfg.train.learning_rate, "warmup": cfg.train.warmup,
                               "schedule": schedule}}
            for (start, cur, batch), end in zip(phases, ends)]


def decay_steps(cfg: ml_collections.ConfigDict) -> int:
    """Where the cosine reaches its floor: train.decay_steps if set (> 0), else train.steps. A run
    extended past its first length keeps its schedule that way (the floor from there on), so a
    from-scratch run of the extended config reproduces every step of it."""
    return cfg.train.get("decay_steps", 0) or cfg.train.steps


def _optim(cfg: ml_collections.ConfigDict) -> OptimConfig:
    t = cfg.train
    return OptimConfig(learning_rate=t.learning_rate, b2=0.98, weight_decay=t.weight_decay, schedule="cosine",
                       warmup_steps=min(t.warmup, decay_steps(cfg) - 1), total_steps=decay_steps(cfg),
                       final_lr_fraction=t.final_lr_fraction, later_rates=_later_rates(cfg))


def _later_phases(cfg: ml_collections.ConfigDict) -> list[tuple[str, ml_collections.ConfigDict]]:
    """[(key, phase)] of the config's LATER_PHASES that start (start > 0), in order."""
    return [(key, cfg[key]) for key in LATER_PHASES if cfg.get(key) is not None and cfg[key].get("start", 0) > 0]


def _later_rates(cfg: ml_collections.ConfigDict) -> tuple[tuple[int, float], ...]:
    """Each later phase's own constant learning rate, from its start (a phase without one keeps the
    rate before it: the schedule, or the previous phase's constant)."""
    return tuple((int(p.start), float(p.learning_rate)) for _, p in _later_phases(cfg) if p.get("learning_rate", 0))


def check_base_export_dir(export_dir: str, out: str) -> None:
    """The export may replace files only in the run's own `<output_dir>/base`; any other
    train.export_dir must be new or empty (refused before any work, and again before the export)."""
    if os.path.exists(export_dir) and not os.path.isdir(export_dir):
        raise UserInputError(f"train.export_dir={export_dir} is a file, not a directory: choose another")
    if export_dir == os.path.join(out, "base") or not os.path.isdir(export_dir) or not os.listdir(export_dir):
        return
    held = sorted(os.listdir(export_dir))
    raise UserInputError(f"train.export_dir={export_dir} is not empty (it holds {os.path.join(export_dir, held[0])}"
                         f"{f' and {len(held) - 1} more' if len(held) > 1 else ''}): the export would replace files "
                         "in it. Choose a new or empty directory, or leave train.export_dir empty to export to "
                         f"{os.path.join(out, 'base')}")


def check_vocab_settings(vocab_dir: str, cfg: ml_collections.ConfigDict) -> None:
    """A resumed run keeps the vocabulary its output dir holds: refuse one built with other
    vocab settings than the config's (the names, hence every row, would differ silently)."""
    path = os.path.join(vocab_dir, VOCAB_MANIFEST)
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        built = json.load(f)
    built.setdefault("wording", "v1")  # manifests before wordings were recorded
    wrong = [f"vocab.{k}={cfg.vocab[k]} but {vocab_dir} was built with {k}={built.get(k)}"
             for k in ("seed", "bpe_size", "wording") if k in cfg.vocab and built.get(k) != cfg.vocab[k]]
    if wrong:
        raise UserInputError("; ".join(wrong) + ": resume with the settings it was built with, or start over "
                             "with --fresh (removes that run's checkpoints, logs and vocabulary) or another "
                             "train.output_dir")


def validate_pretrain(cfg: ml_collections.ConfigDict) -> None:
    t = cfg.train
    problems = []
    for key in ("steps", "batch_size", "save_every", "probe_every", "probe_items"):
        if t[key] < 1:
            problems.append(f"train.{key} must be >= 1, got {t[key]}")
    if not (isinstance(t.get("keep_period", 0), int) and t.get("keep_period", 0) >= 0):
        problems.append(f"train.keep_period must be an integer >= 0 (0: keep only the last two checkpoints), "
                        f"got {t.keep_period}")
    if not (isinstance(t.get("data_workers", 0), int) and t.get("data_workers", 0) >= 0):
        problems.append(f"train.data_workers must be an integer >= 0 (0: one thread), got {t.data_workers}")
    if t.learning_rate <= 0:
        problems.append(f"train.learning_rate must be > 0, got {t.learning_rate}")
    if cfg.vocab.get("wording", "v1") not in WORDINGS:
        problems.append(f"vocab.wording must be one of {', '.join(WORDINGS)}, got {cfg.vocab.wording!r}")
    if not 0 <= t.get("decay_steps", 0) <= t.steps:
        problems.append(f"train.decay_steps must be in [0, train.steps={t.steps}] (0: train.steps), "
                        f"got {t.decay_steps}")
    if problems:
        raise TrainConfigError("invalid pretraining config:\n  - " + "\n  - ".join(problems))
    m = cfg.model
    if not 0 <= m.get("mimetic_init", 0.0) <= 1:
        problems.append(f"model.mimetic_init must be in [0, 1], got {m.mimetic_init}")
    positional = tuple(m.get("positional_heads", ()))
    if len(positional) > m.num_layers or any(int(d) != d or d < 1 for layer in positional for d in layer):
        problems.append(f"model.positional_heads must be at most num_layers={m.num_layers} tuples of offsets >= 1 "
                        f"(one per layer from layer 0), got {positional}")
    if any(len(layer) > m.num_heads for layer in positional):
        problems.append(f"model.positional_heads names more offsets in a layer than its num_heads={m.num_heads} "
                        f"heads (heads cycle through a layer's offsets), got {positional}")
    if any(positional) and not m.get("positional_strength", 0) > 0:
        problems.append("model.positional_strength must be > 0 with positional_heads, "
                        f"got {m.get('positional_strength')}")
    first = cfg.get("first_phase")
    if first is not None and not 0 <= first.steps < t.steps:
        problems.append(f"first_phase.steps must be in [0, train.steps={t.steps}), got {first.steps}")
    begins, later_phases = (first.steps if first is not None else 0), _later_phases(cfg)
    if later_phases and later_phases[0][0] != LATER_PHASES[0]:
        problems.append(f"{later_phases[0][0]} needs the phases before it: third_phase.start is not set")
    for key, later in later_phases:
        if not begins < later.start < t.steps:
            problems.append(f"{key}.start must be in ({begins}, train.steps={t.steps}), got {later.start}")
        begins = max(begins, later.start)
        unknown = sorted(set(later.keys()) - {*LATER_PHASE_OWN, *PHASE_SETTINGS, *KINDS})
        if unknown:
            problems.append(f"{key} sets {unknown}: only start, learning_rate, the mix weights {KINDS} "
                            f"and {PHASE_SETTINGS}")
        if "learning_rate" in later and not later.learning_rate > 0:
            problems.append(f"{key}.learning_rate must be > 0 (leave it out to keep the rate before it), "
                            f"got {later.learning_rate}")
    if problems:
        raise TrainConfigError("invalid pretraining config:\n  - " + "\n  - ".join(problems))
    phase_configs(cfg)  # raises ValueError naming the field


class _Prefetch:
    """Builds the next step's rows on a thread while the current step trains."""

    def __init__(self, make, start: int, stop: int):
        self.q: queue.Queue = queue.Queue(maxsize=2)
        self.thread = threading.Thread(target=self._run, args=(make, start, stop), daemon=True)
        self.thread.start()

    def _run(self, make, start, stop):
        for step in range(start, stop):
            try:
                self.q.put((step, make(step)))
            except Exception as e:  # handed to the trainer, which raises it (else it would wait forever)
                self.q.put((step, e))
                return

    def get(self):
        step, got = self.q.get()
        if isinstance(got, Exception):
            raise got
        return step, got

    def close(self):
        pass


def sft_config(t: ml_collections.ConfigDict) -> SFTConfig:
    """The trainer's settings from cfg.train (also the row buckets `BatchMaker` packs to)."""
    return SFTConfig(steps=t.steps, batch_size=t.batch_size, lr=t.learning_rate, seed=t.seed,
                     warmup=min(t.warmup, t.steps), max_len=t.max_len, min_len=t.min_len, progress=False)


class BatchMaker:
    """A step's training batch from the config and the vocabulary alone. Rows depend only on
    (seed, step), so any process builds the same batch for the same step: worker processes can
    build steps ahead of the trainer (`train.data_workers`) without changing a single row."""

    def __init__(self, cfg: ml_collections.ConfigDict, vocab_dir: str):
        vocab = ReadingVocab.load(vocab_dir)
        self.builder = PromptBuilder(load_tokenizer(vocab_dir), default_top_n=cfg.curriculum.top_n, style="compact")
        self.phases = phase_configs(cfg)
        self.curriculum = PhasedCurriculum([(s, Curriculum(vocab, self.builder, c)) for s, c, _ in self.phases])
        t = cfg.train
        self.sft_cfg = sft_config(t)
        self.pack = t.pack
        self.full_width = bool(t.get("pack_to_max_len", False))

    def __call__(self, step: int):
        cur, batch = [(c, b) for s, c, b in self.phases if s <= step][-1]
        rows = self.curriculum.rows_for_step(step, batch)
        if self.pack:  # several rows per sequence: the same loss, less padding
            longest = max(len(r.prompt_ids) + len(r.response_ids) - 1 for r in rows)
            # As wide as the step's longest row needs (its bucket), not always max_len: a short-row
            # step packed into max_len-wide rows would pay attention over max_len for nothing. On an
            # accelerator that work is cheap and each other width is another program to compile:
            # `train.pack_to_max_len` packs every step of a phase to its max_len.
            width = cur.max_len if self.full_width else min(cur.max_len, self.sft_cfg.bucket_for(longest))
            return pack_rows(rows, self.builder.pad_id, width)
        return build_rows(rows, self.builder.pad_id, self.sft_cfg.max_len)


_WORKER_MAKER: BatchMaker | None = None


def _worker_start(cfg_dict: dict, vocab_dir: str) -> None:
    global _WORKER_MAKER
    # Ctrl-C (or `timeout --signal=INT`) reaches the whole process group: the trainer handles it
    # and stops the pool; a worker that took it too would only print its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    jax.config.update("jax_platforms", "cpu")  # a data worker never touches the accelerator
    _WORKER_MAKER = BatchMaker(ml_collections.ConfigDict(cfg_dict), vocab_dir)


def _worker_batch(step: int):
    return step, _WORKER_MAKER(step)


class _PoolPrefetch:
    """Builds steps ahead in `workers` processes (fresh interpreters: the trainer's JAX state is
    not forked), at most 2 x workers steps ahead, handed back in step order."""

    def __init__(self, cfg: ml_collections.ConfigDict, vocab_dir: str, start: int, stop: int, workers: int):
        self.pool = multiprocessing.get_context("spawn").Pool(workers, _worker_start, (cfg.to_dict(), vocab_dir))
        self.pending: collections.deque = collections.deque()
        self.next, self.stop, self.ahead = start, stop, 2 * workers
        self._fill()

    def _fill(self):
        while self.next < self.stop and len(self.pending) < self.ahead:
            self.pending.append(self.pool.apply_async(_worker_batch, (self.next,)))
            self.next += 1

    def get(self):
        got = self.pending.popleft().get()
        self._fill()
        return got

    def close(self):
        self.pool.terminate()


def _init_model(cfg: ml_collections.ConfigDict, vocab: ReadingVocab, builder: PromptBuilder, vocab_size: int):
    """The initial model and its tied embedding rows (names / values: a shared vector per type + a code each)."""
    mc = base_model_config(cfg, vocab_size, builder.eos_id, builder.pad_id)
    model = Qwen2(mc, rngs=nnx.Rngs(cfg.model.init_seed))
    alpha = float(cfg.model.get("mimetic_init", 0.0))
    if alpha:
        layers = model.layers
        k, o = mimetic_attention(np.asarray(layers.q_kernel[...]), np.asarray(layers.k_kernel[...]),
                                 np.asarray(layers.v_kernel[...]), np.asarray(layers.o_kernel[...]), alpha)
        layers.k_kernel[...] = jnp.asarray(k, layers.k_kernel[...].dtype)
        layers.o_kernel[...] = jnp.asarray(o, layers.o_kernel[...].dtype)
    offsets = {int(layer): tuple(d) for layer, d in enumerate(cfg.model.get("positional_heads", ()))}
    offsets = {layer: d for layer, d in offsets.items() if d}
    if offsets:
        layers = model.layers
        qb, kb = positional_biases(np.asarray(layers.q_bias[...]), np.asarray(layers.k_bias[...]), offsets,
                                   float(cfg.model.positional_strength), cfg.model.rope_theta)
        layers.q_bias[...] = jnp.asarray(qb, layers.q_bias[...].dtype)
        layers.k_bias[...] = jnp.asarray(kb, layers.k_bias[...].dtype)
    tied = (name_groups(vocab) if cfg.model.tie_names else []) + (value_groups(vocab) if cfg.model.tie_values else [])
    if tied:
        model.embed[...] = jnp.asarray(set_codes(model.embed[...], tied, cfg.model.init_seed), model.embed[...].dtype)
    _log(f"model: {mc.num_params() - mc.vocab_size * mc.hidden_size:,} parameters besides the "
         f"{mc.vocab_size}x{mc.hidden_size} embedding ({sum(map(len, tied))} name/value rows as "
         f"{'a shared vector per type + a fixed code each' if tied else 'trained one by one'}); "
         f"vocabulary {vocab_size}")
    return model, tied


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


def _restore(manager, trainer: SFTTrainer, cfg: ml_collections.ConfigDict, vocab: ReadingVocab) -> int:
    """Loads the latest checkpoint into the trainer; returns its step (0 if none)."""
    if manager.latest_step() is None:
        return 0
    abstract = lambda tree: jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    try:
        got = _readable(lambda: manager.restore(manager.latest_step(), args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract(trainer.params)),
            opt_state=ocp.args.StandardRestore(abstract(trainer.opt_state)))),
            str(manager.directory), manager.latest_step(),
            "resume with the config the run was started with, or pass --fresh to start over")
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
    out = os.path.abspath(os.path.expanduser(t.output_dir))
    export_dir = os.path.abspath(os.path.expanduser(t.export_dir or os.path.join(out, "base")))
    check_output_dir(out, not resume, PRETRAIN_ENTRIES, "pretraining")
    refuse(cache_dir_problems(t.get("compilation_cache_dir", None)), "pretraining config")
    check_base_export_dir(export_dir, out)
    if resume:
        check_vocab_settings(os.path.join(out, "vocab"), cfg)
    prepare_output_dir(out, not resume, PRETRAIN_ENTRIES, "pretraining")
    compile_stats.enable_persistent_cache(t.get("compilation_cache_dir", None))
    return out, export_dir


def _trainer(cfg: ml_collections.ConfigDict, vocab_dir: str) -> tuple[ReadingVocab, PromptBuilder, SFTTrainer]:
    """The run's vocabulary, its prompt builder, and the trainer over the initial model."""
    vocab = ReadingVocab.load(vocab_dir)
    tokenizer = load_tokenizer(vocab_dir)
    builder = PromptBuilder(tokenizer, default_top_n=cfg.curriculum.top_n, style="compact")
    model, tied = _init_model(cfg, vocab, builder, len(tokenizer))
    return vocab, builder, SFTTrainer(model, sft_config(cfg.train), tied_rows=tied or None, optim=_optim(cfg))


def checkpoint_model(cfg: ml_collections.ConfigDict, step: int = 0) -> tuple[int, ReadingVocab, PromptBuilder, Qwen2]:
    """(step, vocabulary, prompt builder, model) of checkpoint `step` (0: the latest) of the run in
    train.output_dir. Reads the params and nothing else, and writes nothing, so the run may still
    be training."""
    validate_pretrain(cfg)
    out = os.path.abspath(os.path.expanduser(cfg.train.output_dir))
    vocab_dir, ckpt_dir = os.path.join(out, "vocab"), os.path.join(out, "checkpoints")
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
    # A bare checkpointer on the params item: a CheckpointManager here could tidy the running run's files.
    trainer.params = _readable(lambda: ocp.StandardCheckpointer().restore(os.path.join(ckpt_dir, str(step), "params"),
                                                                         abstract),
                               ckpt_dir, step, "give the config the run was started with, or another --probe-step")
    return step, vocab, builder, trainer.model()


def probe_checkpoint(cfg: ml_collections.ConfigDict, step: int = 0, n: int = 256) -> dict:
    """`checkpoint_model` on `probe_report`'s sets and on binding pairs (`pair_report`), n items a set
    and n pairs, from seed + CHECK_SEED: items neither the progress nor the final probe uses."""
    step, vocab, builder, model = checkpoint_model(cfg, step)
    seed = cfg.train.seed + CHECK_SEED
    report = probe_report(model, probe_sets(vocab, builder, n, seed=seed), builder.pad_id)
    return {"step": step, **report, "pairs": pair_report(model, vocab, builder, n, seed=seed + 97)}


def probe_table(report: dict) -> str:
    """`probe_checkpoint`'s report as a markdown table: a row per relation, a column per context
    length and one for binding pairs (% right), then the overall row and the side sets."""
    lengths = sorted(report["by_length"], key=int)
    pairs = report["pairs"]["by_relation"]
    relations = sorted({r for k in lengths for r in report["by_length"][k]["by_relation"]} | set(pairs))
    pct = lambda x: "" if x is None else f"{100 * x:.1f}"
    lines = [f"| relation | {' | '.join(f'{k} passages' for k in lengths)} | pairs (both right) |",
             "|---|" + "---:|" * (len(lengths) + 1)]
    for r in relations:
        cells = [pct(report["by_length"][k]["by_relation"].get(r)) for k in lengths] + [pct(pairs.get(r))]
        lines.append(f"| {r} | {' | '.join(cells)} |")
    cells = [pct(report["by_length"][k]["accuracy"]) for k in lengths] + [pct(report["pairs"]["both"])]
    lines.append(f"| **all** | {' | '.join(cells)} |")
    side = ", ".join(f"{k} {pct(report[k]['accuracy'])}" for k in SIDE_SETS if k in report)
    return "\n".join(lines) + f"\n\nstep {report['step']}; {side}"


def run_pretrain(cfg: ml_collections.ConfigDict, resume: bool = True, argv: list[str] | None = None) -> dict:
    """Train (or resume) the reading base and export it; returns the summary dict."""
    validate_pretrain(cfg)
    t = cfg.train
    out, export_dir = _prepare_run(cfg, resume)
    vocab_dir = os.path.join(out, "vocab")
    if not ReadingVocab.exists(vocab_dir):
        build_vocab(vocab_dir, seed=cfg.vocab.seed, bpe_size=cfg.vocab.bpe_size, wording=cfg.vocab.get("wording", "v1"))
    vocab, builder, trainer = _trainer(cfg, vocab_dir)
    # Progress only; the final sets are never looked at here.
    sets = probe_sets(vocab, builder, t.probe_items, seed=t.seed)
    seen = probe_items(vocab, builder, min(256, t.probe_items), seed=t.seed + 2000, pool="pretrain")
    copy = copy_probe_items(vocab, builder, min(256, t.probe_items), seed=t.seed + 3000)

    # The last two checkpoints, and every keep_period-th one (a phase boundary to start from again).
    manager = ocp.CheckpointManager(os.path.join(out, "checkpoints"),
                                    options=ocp.CheckpointManagerOptions(max_to_keep=2,
                                                                         keep_period=t.get("keep_period", 0) or None))
    step = _restore(manager, trainer, cfg, vocab) if resume else 0
    writer = MetricsWriter(os.path.join(out, "logs"), resume_step=step)
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
    finally:  # an interrupted run stops its data workers at once
        prefetch.close()
    manager.wait_until_finished()
    writer.close()
    check_base_export_dir(export_dir, out)  # again: the run may have taken hours
    final = export_base(trainer.model(), vocab_dir, export_dir, cfg, argv, seed=t.seed,
                        n_probe=t.get("final_probe_items", t.probe_items),
                        history=read_history(os.path.join(out, "logs")))
    summary = {"steps": t.steps, "probe": final, "export_dir": export_dir}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    _log(f"final probe on reserved names: {100 * final['accuracy']:.1f}% over 2/8/16 passages "
         f"(worst relation {100 * final['worst_relation']:.1f}%), multi-objective "
         f"{100 * final['multi']['accuracy']:.1f}%; base written to {export_dir}")
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
    keys = {"probe": "probe_accuracy", "probe_all_lengths": "probe_all_lengths", "probe_multi": "probe_multi",
            "probe_worst_relation": "probe_worst_relation"}
    out, last = [], 0
    for r in rows:
        out.append({"step": r["step"], "loss": round(r["loss"], 4),
                    **{k: round(r[m], 4) for k, m in keys.items() if m in r}})
        if r.get("steps_per_second"):  # wall time of the interval, its probe and any compile included
            out[-1]["seconds"] = round((r["step"] - last) / r["steps_per_second"], 1)
        last = r["step"]
    return out


def machine_facts() -> dict:
    """What the export ran on (the run's machine when it ran on one kind): CPU, cores, memory, devices."""
    cpu, mem = platform.processor() or platform.machine(), None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
        with open("/proc/meminfo", encoding="utf-8") as f:
            kb = next((int(line.split()[1]) for line in f if line.startswith("MemTotal")), 0)
            mem = round(kb / 2 ** 20, 1)
    except OSError:
        pass
    devices = jax.devices()
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem, "platform": platform.platform(),
            "jax_devices": f"{len(devices)} x {devices[0].device_kind}"}


def base_probe(base_dir: str, n: int = 512, seed: int = 0) -> dict:
    """The progress probe's 2-passage figure for a base directory as it is stored (bf16 weights,
    read in float32): reserved names only, the same items the pretraining run probed with
    (seed + 1000). The shipped figure is `final_probe`'s."""
    builder = probe_builder(base_dir)
    items = probe_items(ReadingVocab.load(base_dir), builder, n, seed=seed + 1000, pool="reserved")
    return reading_probe(from_pretrained(base_dir), items, builder.pad_id)


def final_probe(base_dir: str, n: int = 512, seed: int = 0) -> dict:
    """The figure a base ships with: the stored weights (bf16, read in float32) on the FINAL probe
    sets (seed + FINAL_SEED: items no progress probe, checkpoint choice or stopping rule saw),
    by context length (2, 8, 16 passages) and relation, plus the multi-objective items."""
    builder, sets = final_probe_sets(base_dir, n, seed)
    return probe_report(from_pretrained(base_dir), sets, builder.pad_id)


def final_probe_sets(base_dir: str, n: int = 512, seed: int = 0) -> tuple[PromptBuilder, dict]:
    """`final_probe`'s items for a base directory ({set name: items}) and the prompt builder
    that made them (its pad_id pads the probe)."""
    builder = probe_builder(base_dir)
    return builder, probe_sets(ReadingVocab.load(base_dir), builder, n, seed, final=True)


def probe_builder(base_dir: str) -> PromptBuilder:
    """The prompt builder every probe of a stored base formats its items with (the agent's
    compact prompts, two passages per search)."""
    return PromptBuilder(load_tokenizer(base_dir), default_top_n=2, style="compact")


def export_base(model: Qwen2, vocab_dir: str, out_dir: str, cfg: ml_collections.ConfigDict,
                argv: list[str] | None = None, seed: int = 0, n_probe: int = 512, history: list | None = None) -> dict:
    """bf16 Hugging Face directory + base_manifest.json (command, config, every phase, the final
    probe measured on the stored bf16 weights (`reading_probe`), the progress probe's 2-passage
    figure, binding pairs by relation (`pair_probe`), every file's size and sha256, tensor shapes).
    Returns the final probe."""
    save_pretrained(model, out_dir, tokenizer_dir=vocab_dir, dtype="bfloat16")
    probe = final_probe(out_dir, n_probe, seed)
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
        "phases": phase_records(cfg),
        "reading_probe": probe,
        "progress_probe": base_probe(out_dir, n_probe, seed),
        # Binding per relation, on pairs no final or progress set draws from (seeds apart).
        "pair_probe": pair_probe(out_dir, max(1, n_probe // 2), seed=seed + FINAL_SEED + 97),
        "history": history or [],
        # Wall time summed over the logged intervals (steps lost to an interruption not counted).
        "pretraining": {"seconds": round(sum(h.get("seconds", 0) for h in history or []), 1),
                        "machine": machine_facts()},
        "tensors": tensors,
        "files": files,
    }
    with open(os.path.join(out_dir, BASE_MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, default=list)
    return probe
