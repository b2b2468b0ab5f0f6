"""Probe: does a tiny model SFT'd on scripted demos write well-formed MemSearcher first acts?

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        .venv/bin/python bench/sft_probe.py --hidden 128 --layers 2 --steps 300

Builds the synthetic world (cached under /tmp), makes demonstrations from the train split,
runs SFT, then greedily generates (naive loop: full forward + argmax, no KV cache) the first
act of some held-out questions and reports how many parse as a tool call, and how many search
exactly the gold hop-1 query.
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memsearcher_jax.agent.parsing import ActKind, classify_act, parse_tool_calls
from memsearcher_jax.agent.prompts import MEMORY_UPDATE_INSTRUCTION, PromptBuilder, memsearcher_system_prompt
from memsearcher_jax.data.demos import DemoConfig, demo_conversations, demo_stats, make_demonstrations
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.world_cache import prepare_world
from memsearcher_jax.models import ModelConfig, Qwen2
from memsearcher_jax.rl.sft import SFTConfig, evaluate_loss, sft_train
from retrieval.bm25 import BM25Retriever


def _jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def greedy(model, prompt: list[int], eos_id: int, max_new: int, width: int) -> list[int]:
    """Naive greedy decoding: one full forward per token over a fixed-width buffer (one compile)."""
    graphdef, params = nnx.split(model, nnx.Param)

    @jax.jit
    def next_token(params, buf, n):
        logits = nnx.merge(graphdef, params)(buf, attention_mask=jnp.arange(width)[None] < n)
        return jnp.argmax(logits[0, n - 1])

    buf = np.zeros((1, width), np.int32)
    buf[0, :len(prompt)] = prompt
    n, out = len(prompt), []
    while len(out) < max_new and n < width:
        tok = int(next_token(params, jnp.asarray(buf), n))
        out.append(tok)
        buf[0, n] = tok
        n += 1
        if tok == eos_id:
            break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--questions", type=int, default=12)
    ap.add_argument("--cache", default="/tmp/memsearcher_probe_world")
    args = ap.parse_args()

    # The fixed prompt texts go into tokenizer training, so they compress to few tokens.
    paths = prepare_world(args.cache, seed=0, extra_texts=[memsearcher_system_prompt(), MEMORY_UPDATE_INSTRUCTION])
    tok = load_tokenizer(paths.tokenizer_dir)
    builder = PromptBuilder(tok)
    retriever = BM25Retriever.from_passages(_jsonl(paths.corpus))
    demos = make_demonstrations(_jsonl(paths.train), builder, retriever, seed=0,
                                config=DemoConfig(vague_query_rate=0.15, wrong_answer_rate=0.1,
                                                  early_answer_rate=0.1, early_two_hop="first_hop", top_n=3))
    stats = demo_stats(demos)
    print("demos:", {k: round(v, 3) if isinstance(v, float) else v for k, v in stats.items()})
    convs = demo_conversations(demos)

    head_dim = args.hidden // args.heads
    cfg = ModelConfig.tiny(vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                           num_layers=args.layers, num_heads=args.heads, num_kv_heads=max(1, args.heads // 2),
                           head_dim=head_dim)
    model = Qwen2(cfg, rngs=nnx.Rngs(0))
    print(f"model: hidden={args.hidden} layers={args.layers} heads={args.heads} params={cfg.num_params():,}")
    sft_cfg = SFTConfig(steps=args.steps, batch_size=args.batch, lr=args.lr, warmup=args.warmup, seed=0,
                        max_len=1280, min_len=640, progress=False)
    t0 = time.perf_counter()
    model, history = sft_train(model, convs, sft_cfg, pad_id=builder.pad_id)
    train_s = time.perf_counter() - t0
    losses = [h["loss"] for h in history]
    print(f"sft: {args.steps} steps x {args.batch} rows in {train_s:.1f}s; loss first {losses[0]:.3f} "
          f"last10 {np.mean(losses[-10:]):.3f}")

    heldout = _jsonl(paths.heldout)
    held_demos = make_demonstrations(heldout[:40], builder, retriever, seed=1, config=DemoConfig(0, 0, 0, top_n=3))
    held_loss = evaluate_loss(model, demo_conversations(held_demos), builder.pad_id, sft_cfg)
    print(f"held-out masked loss (clean demos): {held_loss:.3f}")

    rows = heldout[:args.questions]
    ok = gold_query = 0
    t1 = time.perf_counter()
    for row in rows:
        out = greedy(model, builder.memsearcher_context(row["question"]), builder.eos_id, max_new=80, width=640)
        text = builder.decode_act(out)
        kind = classify_act(text) if out and out[-1] == builder.eos_id else ActKind.INVALID
        calls = parse_tool_calls(text.split("</think>")[-1]) if kind == ActKind.TOOL_CALLS else []
        ok += kind == ActKind.TOOL_CALLS
        gold_query += bool(calls) and calls[0].query == row["queries"][0]
        print(f"[{kind.value}] {row['question']}  (gold query: {row['queries'][0]!r})\n    {text!r}")
    print(f"well-formed first acts (tool call): {ok}/{len(rows)}; exact gold hop-1 query: {gold_query}/{len(rows)}; "
          f"generation {time.perf_counter() - t1:.1f}s; training {train_s:.1f}s")


if __name__ == "__main__":
    main()
