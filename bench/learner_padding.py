"""The learner's padding on realistic row lengths: the packed layout before and after issue 59's fix.

    python bench/learner_padding.py [--lengths bench/data/default_row_lengths.txt | --uniform 60 400]
                                    [--steps 300] [--seed 0] [--config configs/default.py]

Pure numpy: no model, no compile, seconds. Each step draws 104-199 rows (the default's range,
`rows` in its logs/metrics.jsonl) of the given lengths (with replacement), splits them at random
into rl.optimizer_steps mini-batches and lays out every pass as the learner does
(`rl/packing.py`): the update per mini-batch, micro_batch_size rows a call; the log-prob pass over
all rows, logprob_batch_size rows a call. Layouts:

- unpacked: rows of like length together, micro_batch_size a call, each call its longest's octave;
- before: packed rows as wide as the step's own rows (their quarter-octave bucket), the last call
  padded up to block_rows;
- wider rows / split last call: each half of the fix alone;
- after: packed rows as wide as the longest's whole octave where the memory plan's row width
  allows (`packed_width`), the calls split by `block_sizes` (no spare rows).

Printed per layout: the padding share of the update's slots (what `pad_frac_packed` logs) and of
the log-prob pass's, the distinct call shapes (rows x width) seen over all steps, calls per step,
and the compute per real token under a FLOP model that also counts attention over the whole
packed row (the mask hides other segments but the scores are computed): the default's model
(the shipped base) and the Qwen2.5-0.5B shape. Padding counts slots; a wider row also costs attention per slot.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from memsearcher_jax.bases import DEFAULT_BASE  # noqa: E402
from memsearcher_jax.config_utils import load_config  # noqa: E402
from memsearcher_jax.memory_estimates import training_row_width  # noqa: E402
from memsearcher_jax.rl.packing import block_rows, block_sizes, first_fit, packed_width  # noqa: E402
from memsearcher_jax.sampling.buckets import bucket  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def model_shape(hf: dict) -> tuple[int, int, int, int, int]:
    """(hidden, heads, kv heads, head dim, MLP width) of a HF Qwen2 config."""
    return (hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"],
            hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"]), hf["intermediate_size"])


with open(os.path.join(DEFAULT_BASE, "config.json")) as _f:
    MODELS = {"default base": model_shape(json.load(_f)), "Qwen2.5-0.5B": (896, 14, 2, 64, 4864)}


def read_lengths(path: str) -> np.ndarray:
    with open(path) as f:
        return np.array([int(x) for x in f.read().split("\n") if x.strip() and not x.startswith("#")])


def padded_last(n: int, cap: int) -> list[int]:
    """The calls before the fix: cap rows each, the last padded up to block_rows."""
    return [block_rows(min(cap, n - i), cap) for i in range(0, n, cap)]


def packed_calls(lengths, columns, cap, min_len, plan_width, wide: bool, split: bool) -> list[tuple[int, int]]:
    """(rows, width) of each call over these conversations, packed."""
    width = packed_width(int(lengths.max()), min_len, columns, plan_width if wide else 0)
    n = first_fit(lengths, width).num_rows
    return [(r, width) for r in (block_sizes(n, cap) if split else padded_last(n, cap))]


def unpacked_calls(lengths, columns, cap, min_len) -> list[tuple[int, int]]:
    order = np.sort(lengths)
    return [(cap, min(bucket(int(order[i:i + cap].max()), min_len), columns)) for i in range(0, len(order), cap)]


def cost(calls, model) -> float:
    """Multiply-adds of the trunk's layer over these calls (dense + attention over whole rows)."""
    h, heads, kv, d, ffn = model
    dense = h * (heads * d + 2 * kv * d) + heads * d * h + 3 * h * ffn
    return float(sum(r * w * (dense + 2 * heads * d * w) for r, w in calls))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default=os.path.join(HERE, "data", "default_row_lengths.txt"))
    ap.add_argument("--uniform", type=int, nargs=2, metavar=("LO", "HI"), help="draw lengths from LO..HI instead")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default=os.path.join(os.path.dirname(HERE), "configs", "default.py"))
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    rl, plan = cfg.rl, training_row_width(cfg)
    pool = None if args.uniform else read_lengths(args.lengths)
    layouts = {"unpacked": None, "before": (False, False), "wider rows": (True, False),
               "split last call": (False, True), "after": (True, True)}
    rng = np.random.default_rng(args.seed)
    acc = {k: {"real": 0, "slots": 0, "lp_slots": 0, "calls": 0, "shapes": set(),
               **{m: 0.0 for m in MODELS}} for k in layouts}
    real_lp = 0
    for _ in range(args.steps):
        n = int(rng.integers(104, 200))
        lengths = rng.integers(args.uniform[0], args.uniform[1] + 1, n) if args.uniform else rng.choice(pool, n)
        columns = bucket(int(lengths.max()), rl.min_seq_len, steps_per_octave=4)  # grpo.pack_rows
        real_lp += int(lengths.sum())
        minibatches = np.array_split(rng.permutation(n), rl.optimizer_steps)
        for name, how in layouts.items():
            a = acc[name]
            for idx in minibatches:
                calls = (unpacked_calls(lengths[idx], columns, rl.micro_batch_size, rl.min_seq_len) if how is None else
                         packed_calls(lengths[idx], columns, rl.micro_batch_size, rl.min_seq_len, plan, *how))
                a["real"] += int(lengths[idx].sum())
                a["slots"] += sum(r * w for r, w in calls)
                a["calls"] += len(calls)
                a["shapes"] |= {("update",) + c for c in calls}
                for m, shape in MODELS.items():
                    a[m] += cost(calls, shape)
            calls = (unpacked_calls(lengths, columns, rl.logprob_batch_size, rl.min_seq_len) if how is None else
                     packed_calls(lengths, columns, rl.logprob_batch_size, rl.min_seq_len, plan, *how))
            a["lp_slots"] += sum(r * w for r, w in calls)
            a["shapes"] |= {("logprob",) + c for c in calls}
    src = f"uniform {args.uniform[0]}-{args.uniform[1]}" if args.uniform else os.path.relpath(args.lengths)
    print(f"{args.steps} steps of 104-199 rows from {src}; micro_batch_size {rl.micro_batch_size}, "
          f"logprob_batch_size {rl.logprob_batch_size}, min_seq_len {rl.min_seq_len}, plan row width {plan}")
    base = acc["before"]
    print("| layout | update padding | log-prob padding | call shapes | update calls / step | "
          + " | ".join(f"{m} compute / token vs before" for m in MODELS) + " |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(MODELS))
    for name, a in acc.items():
        ratios = " | ".join(f"{a[m] / base[m]:.3f}" for m in MODELS)
        print(f"| {name} | {1 - a['real'] / a['slots']:.1%} | {1 - real_lp / a['lp_slots']:.1%} | {len(a['shapes'])} | "
              f"{a['calls'] / args.steps:.1f} | {ratios} |")


if __name__ == "__main__":
    main()
