"""Per-turn context: the memory workflow vs the ReAct workflow on the same questions and model.

    python bench/context.py [--model HF_DIR | --checkpoint RUN_DIR] [--questions 64] [--turns 10]
                            [--react-share 0.5] [--config.sft.steps=N ...]

Without --model/--checkpoint, the embedded default's model is warm-started on scripted
demonstrations of BOTH workflows (a share --react-share recorded in the ReAct format, the rest
in the MemSearcher format; same script, searches and answers), so each workflow is one the
model was taught; it is cached in runs/bench_context/warmstart_react<share>. (A model taught
only the MemSearcher format answers in its first ReAct turn, which makes the ReAct column
meaningless.) Both workflows run greedily on the same held-out questions; the table
gives prompt tokens per act call by turn index (mean and max) and the total tokens processed
per question (prompt + generated tokens of every generation call, memory updates included).
The paper's claim: flat per-turn context for the memory agent, linear growth for ReAct.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np

from memsearcher_jax.agent.rollout import AgentRunner
from memsearcher_jax.settings.config_utils import split_overrides


def tokens_processed(traj) -> int:
    """Prompt + generated tokens over every generation call of one trajectory."""
    total = 0
    for conv in traj.conversations:
        gen_runs, pos, prefix = [], 0, len(conv.prompt_ids)
        # Each maximal run of generated tokens is one call; its prompt is everything before it.
        mask = conv.loss_mask
        while pos < len(mask):
            if mask[pos] == 1:
                start = pos
                while pos < len(mask) and mask[pos] == 1:
                    pos += 1
                gen_runs.append((start, pos))
            else:
                pos += 1
        for _start, end in gen_runs:
            total += prefix + end  # prompt + response so far (includes this call's output)
    return total


def per_turn(trajs) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for t in trajs:
        for i, n in enumerate(t.context_tokens):
            out.setdefault(i + 1, []).append(n)
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs", "default.py"))
    ap.add_argument("--model", default="", help="a Hugging Face model directory")
    ap.add_argument("--checkpoint", default="", help="a training output directory")
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=10, help="turn limit for both workflows")
    ap.add_argument("--react-share", type=float, default=0.5,
                    help="share of ReAct-format demos in the warm start built without --model/--checkpoint")
    ap.add_argument("--out", default="runs/bench_context")
    args = ap.parse_args(rest)
    if not 0 <= args.react_share <= 1:
        ap.error(f"--react-share must be in [0, 1], got {args.react_share}")

    from memsearcher_jax.app.experiment import agent_config, build_sampler, build_setup, sampling_mesh
    from memsearcher_jax.app.jobs import restore_policy
    from memsearcher_jax.app.warm_start import warm_start
    from memsearcher_jax.models import from_pretrained
    from memsearcher_jax.rl.grpo import score_trajectories
    from memsearcher_jax.settings import load_settings

    ws = os.path.join(args.out, f"warmstart_react{args.react_share:g}")
    cached = os.path.isfile(os.path.join(ws, "config.json"))
    if not (args.model or args.checkpoint) and os.path.exists(ws) and not cached:
        ap.error(f"--out: {ws} exists but holds no cached warm start (config.json); the warm start would write model "
                 "files there: give another --out")
    cfg = load_settings(args.config, overrides).with_values({"train.output_dir": args.out})  # built once
    setup = build_setup(cfg)
    if args.model:
        policy = from_pretrained(args.model)
    elif args.checkpoint:
        policy, _ = restore_policy(args.checkpoint)
    else:
        # Not the old "warmstart" dir: a model cached there was taught the MemSearcher format only.
        ws_dir = os.path.join(args.out, f"warmstart_react{args.react_share:g}")
        cfg = cfg.with_values({"sft.react_share": args.react_share})
        policy = from_pretrained(warm_start(cfg, setup, ws_dir))
    sampler = build_sampler(cfg, policy, sampling_mesh(cfg))  # only a sampler: no learner is needed
    questions = setup.eval_questions[: args.questions]
    results = {}
    for workflow in ("memsearcher", "react"):
        agent = dataclasses.replace(agent_config(cfg).evaluation(args.turns), workflow=workflow,
                                    max_context_tokens=1 << 20, max_response_tokens=1 << 20)
        runner = AgentRunner(setup.builder, sampler, setup.retriever, agent)
        trajs = runner.run(questions, group_size=1, seed=0)
        results[workflow] = trajs

    turns = sorted(set(per_turn(results["memsearcher"])) | set(per_turn(results["react"])))
    mem, react = per_turn(results["memsearcher"]), per_turn(results["react"])
    print(f"\n{len(questions)} held-out questions, greedy, up to {args.turns} turns\n")
    print("| turn | memory: mean prompt | memory: max | memory: n | react: mean prompt | react: max | react: n |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for turn in turns:
        m, r = mem.get(turn, []), react.get(turn, [])
        fmt = lambda v, f: (f"{f(v):.0f}" if v else "-")
        print(f"| {turn} | {fmt(m, np.mean)} | {fmt(m, np.max)} | {len(m)} | {fmt(r, np.mean)} | {fmt(r, np.max)} "
              f"| {len(r)} |")
    for workflow, trajs in results.items():
        totals = [tokens_processed(t) for t in trajs]
        searches = np.mean([t.num_searches for t in trajs])
        em = 100 * np.mean([r.em for r in score_trajectories(trajs)])
        print(f"{workflow:>12}: total tokens processed per question mean {np.mean(totals):.0f} max {np.max(totals)}; "
              f"turns mean {np.mean([len(t.context_tokens) for t in trajs]):.2f}; searches mean {searches:.2f}; "
              f"EM {em:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
