"""Sampler benchmark: our JAX sampler vs transformers' PyTorch `generate`, and vs a floor.

    python bench/sampler.py [--small] [--cases plain1,plain8,plain32,agent] [--dtype float32]

The one-shot column times a second `generate(model, ...)` call (the function, not a kept
Sampler): it must reuse the first call's compiled programs.

Everything is measured in one run on the same random weights (a Qwen2.5-0.5B-shaped model,
or a smaller one with --small). Compile time (the first call) is reported apart and never
inside a timing.

Cases:
- plainB: batch B, 256-token prompts, exactly 128 new tokens (no stops; torch gets
  min_new_tokens=128).
- agent: batch 32, one shared 500-token system prompt + ragged 50-300-token suffixes,
  stop on end-of-turn, 128 new tokens; transformers gets the same left-padded batch.

The floor of a case is the time the unavoidable work takes on this machine: prefill of the
distinct prompt tokens (the shared prefix once) plus, for every decode step, the larger of
(FLOPs / matmul rate) and (weight + KV-cache bytes read / copy bandwidth). The matmul rate
(f32 or bf16 jnp.dot of 2048^2) and the copy bandwidth (read + write traffic of copying a
256 MiB array) are measured in the same run.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memsearcher_jax.models import ModelConfig, Qwen2, from_pretrained, save_pretrained
from memsearcher_jax.sampling import BucketConfig, Sampler, generate

EOT = 7  # stands for <|im_end|> (random weights: any id works)


def small_config(**kw) -> ModelConfig:
    return ModelConfig(vocab_size=32768, hidden_size=384, intermediate_size=1024, num_layers=6, num_heads=6,
                       num_kv_heads=2, head_dim=64, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, **kw)


def measure_machine(dtype: str) -> tuple[float, float]:
    """(matmul FLOP/s in `dtype`, copy bandwidth in bytes/s of read + write traffic)."""
    mm = jax.jit(lambda x, y: x @ y)
    rate = 0.0
    for n in (1024, 2048, 3072):  # the best rate any size reaches
        a = jnp.ones((n, n), dtype)
        mm(a, a).block_until_ready()
        best = min(_time(lambda: mm(a, a).block_until_ready()) for _ in range(5))
        rate = max(rate, 2 * n ** 3 / best)
    src = np.ones(64 * 1024 * 1024, np.float32)  # 256 MiB
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(_time(lambda: np.copyto(dst, src)) for _ in range(5))
    return rate, 2 * src.nbytes / best


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def floor_seconds(cfg: ModelConfig, prefill_tokens: int, prefill_ctx: float, rows: list[tuple[int, int]],
                  rate: float, bw: float, param_bytes: int, cache_bytes: int) -> float:
    """Lower bound on the case's time.

    prefill_tokens: distinct prompt tokens that must be processed (shared prefix counted once);
    prefill_ctx: their mean attention context; rows: (prompt length, generated tokens) per row.
    """
    L, H, K, Dh, D, V = (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size,
                         cfg.vocab_size)
    body = 2 * (cfg.num_params() - V * D * (1 if cfg.tie_word_embeddings else 2))  # layers, per token
    head = 2 * V * D  # logits of one token (a prompt needs them only at its last token)
    dense = body + head
    attn = lambda ctx: 4 * L * H * Dh * ctx  # QK^T and PV per token
    weights = cfg.num_params() * param_bytes
    t = max((prefill_tokens * (body + attn(prefill_ctx)) + len(rows) * head) / rate, weights / bw)
    steps = max(n for _, n in rows)
    for i in range(steps):
        live = [(p + i) for p, n in rows if i < n]
        flops = len(live) * dense + sum(attn(c) for c in live)
        kv = sum(2 * L * K * Dh * c * cache_bytes for c in live)
        t += max(flops / rate, (weights + kv) / bw)
    return t


def make_prompts(case: str, rng: np.random.RandomState, vocab: int):
    if case.startswith("plain"):
        b = int(case[len("plain"):])
        return [rng.randint(10, vocab, 256).tolist() for _ in range(b)], ()
    if case == "agent":
        system = rng.randint(10, vocab, 500).tolist()
        return [system + rng.randint(10, vocab, int(rng.randint(50, 301))).tolist() for _ in range(32)], (EOT,)
    raise ValueError(f"unknown case {case!r}; expected plain<B> or agent")


def run_torch(hf, prompts, stop_ids, new_tokens: int):
    import torch

    t = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), t), dtype=torch.long)
    mask = torch.zeros((len(prompts), t), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, t - len(p):] = torch.tensor(p)
        mask[i, t - len(p):] = 1
    kw = dict(do_sample=False, max_new_tokens=new_tokens, pad_token_id=0)
    if stop_ids:
        kw["eos_token_id"] = list(stop_ids)
    else:
        kw.update(min_new_tokens=new_tokens, eos_token_id=None)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = hf.generate(ids, attention_mask=mask, **kw)
        dt = time.perf_counter() - t0
    gen = out[:, t:]
    n_tokens = 0
    for row in gen.tolist():
        n = len(row)
        for j, tok in enumerate(row):
            if stop_ids and tok in stop_ids:
                n = j + 1
                break
        n_tokens += n
    return dt, n_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="plain1,plain8,plain32,agent")
    ap.add_argument("--small", action="store_true", help="a smaller model shape (quicker)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--no-torch", action="store_true", help="skip transformers (our sampler and the floor only)")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]

    cfg = small_config() if args.small else ModelConfig.qwen2_5_0_5b()
    cfg = cfg.replace(dtype=args.dtype, param_dtype=args.dtype)
    print(f"model: {'small' if args.small else 'Qwen2.5-0.5B'}-shaped, {cfg.num_params() / 1e6:.0f}M params, "
          f"random weights, {args.dtype}; devices: {jax.devices()[0].platform} x{jax.device_count()}; "
          f"torch threads: ", end="")
    import torch
    print(torch.get_num_threads())
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]

    tmp = tempfile.mkdtemp(prefix="bench_sampler_")
    t0 = time.perf_counter()
    save_pretrained(Qwen2(cfg, rngs=nnx.Rngs(0)), tmp)
    model = from_pretrained(tmp, dtype=args.dtype)
    hf = None
    if not args.no_torch:
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch_dtype).eval()
    print(f"weights built and loaded in {time.perf_counter() - t0:.1f}s ({tmp})")

    rate, bw = measure_machine(args.dtype)
    print(f"machine: matmul {rate / 1e9:.1f} GFLOP/s ({args.dtype}), copy bandwidth {bw / 1e9:.1f} GB/s "
          f"(read+write); other processes share these cores, so numbers are noisy")

    cache_dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    sampler = Sampler(model, cache_dtype=cache_dtype, buckets=BucketConfig(min_shared_prefix=64))
    pbytes = jnp.dtype(args.dtype).itemsize
    cbytes = jnp.dtype(cache_dtype).itemsize
    rng = np.random.RandomState(0)
    rows_out = []
    for case in cases:
        prompts, stops = make_prompts(case, rng, cfg.vocab_size)
        n_new = args.new_tokens
        kw = dict(max_new_tokens=n_new, stop_token_ids=stops)
        compile_s = _time(lambda: sampler.generate(prompts, **kw))
        t0 = time.perf_counter()
        outs = sampler.generate(prompts, **kw)
        ours = time.perf_counter() - t0
        ours_tokens = sum(len(o.tokens) for o in outs)
        # The one-shot function a user may call in a loop: its second call must reuse the programs.
        generate(model, prompts, cache_dtype=cache_dtype, **kw)
        one_shot = _time(lambda: generate(model, prompts, cache_dtype=cache_dtype, **kw))
        if case == "agent":
            shared = 500
            distinct = shared + sum(len(p) - shared for p in prompts)
            ctx = (shared * shared / 2 + sum((len(p) - shared) * (shared + (len(p) - shared) / 2)
                                             for p in prompts)) / distinct
        else:
            distinct = sum(len(p) for p in prompts)
            ctx = len(prompts[0]) / 2
        floor = floor_seconds(cfg, distinct, ctx, [(len(p), len(o.tokens)) for p, o in zip(prompts, outs)],
                              rate, bw, pbytes, cbytes)
        torch_s, torch_tokens = (float("nan"), 0)
        if hf is not None:
            run_torch(hf, [prompts[0][:8]], stops, 2)  # warm-up
            torch_s, torch_tokens = run_torch(hf, prompts, stops, n_new)
        rows_out.append((case, len(prompts), ours_tokens, compile_s - ours, ours, ours_tokens / ours,
                         torch_tokens / torch_s if hf is not None else float("nan"), torch_s, floor, one_shot))
        print(f"  done {case}: ours {ours:.2f}s, torch {torch_s:.2f}s, floor {floor:.2f}s", flush=True)

    print()
    print("| case | batch | tokens | compile s | ours s | ours tok/s | torch tok/s | torch s | speed-up "
          "| one-shot generate() s | one-shot speed-up | floor s | ours % of floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case, b, n, comp, ours, otps, ttps, ts, floor, one in rows_out:
        print(f"| {case} | {b} | {n} | {comp:.1f} | {ours:.2f} | {otps:.1f} | {ttps:.1f} | {ts:.2f} | "
              f"{ts / ours:.2f}x | {one:.2f} | {ts / one:.2f}x | {floor:.2f} | {100 * floor / ours:.0f}% |")
    print(f"\ncompiled programs: {sampler.num_compilations} (keys: {sorted(sampler.compiled_keys)})")


if __name__ == "__main__":
    main()
