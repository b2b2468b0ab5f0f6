"""Top-p / top-k filtering cost: the candidate fast path against the bisection it replaced.

    python bench/top_p.py [--vocab 151936] [--batches 8,32] [--top-p 0.9]

Both are measured in this run on the same logits, jitted, compile excluded. Two kinds of rows:
- peaked: a confident model's step (a few dozen tokens hold the nucleus), where the fast path
  reads the cut off the 256 largest logits;
- flat: random logits, every row's nucleus is thousands of tokens wide, so the fast path falls
  back to the bisection for the batch (its worst case: the candidates were computed for nothing).
The masks are checked equal before anything is timed.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from memsearcher_jax.sampling.distributions import _bisect_mask, filter_mask


def _time(fn, x, repeats: int = 10) -> float:
    jax.block_until_ready(fn(x))  # compile
    t0 = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(x))
    return (time.perf_counter() - t0) / repeats


def logits(kind: str, b: int, v: int) -> jax.Array:
    noise = jax.random.normal(jax.random.key(0), (b, v))
    if kind == "flat":
        return 3.0 * noise
    # ~30 boosted tokens per row carry nearly all the mass.
    boost = jax.random.uniform(jax.random.key(1), (b, v)) < 30 / v
    return noise + 18.0 * boost


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151936, help="vocabulary size (Qwen2.5: 151936)")
    ap.add_argument("--batches", default="8,32", help="comma-separated row counts")
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--top-k", type=int, default=0)
    args = ap.parse_args()
    p, k = jnp.float32(args.top_p), jnp.int32(args.top_k)
    fast = jax.jit(lambda x: filter_mask(x, p, k))
    slow = jax.jit(lambda x: _bisect_mask(x, p, k))
    print(f"top_p={args.top_p} top_k={args.top_k} vocab={args.vocab} on {jax.devices()[0].platform}")
    print(f"{'rows':>5} {'logits':>7} {'bisection ms':>13} {'filter_mask ms':>15} {'speed-up':>9} {'nucleus max':>12}")
    for b in (int(x) for x in args.batches.split(",")):
        for kind in ("peaked", "flat"):
            x = logits(kind, b, args.vocab)
            mask = fast(x)
            if not bool(jnp.all(mask == slow(x))):
                raise SystemExit(f"masks differ at rows={b} {kind}")
            t_slow, t_fast = _time(slow, x), _time(fast, x)
            print(f"{b:>5} {kind:>7} {1e3 * t_slow:>13.1f} {1e3 * t_fast:>15.1f} {t_slow / t_fast:>8.2f}x "
                  f"{int(jnp.max(jnp.sum(mask, -1))):>12}")


if __name__ == "__main__":
    main()
