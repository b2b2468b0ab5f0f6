"""Where a workflow's episodes fail: a per-episode account of a trained model's greedy runs.

    python bench/episode_report.py --run runs/paper_tables --workflows memsearcher,react \
        [--models warm_start,grpo] [--objectives 2] [--questions 100] [--out DIR]

Reads the runs `bench/paper_tables.py` left in RUN/<workflow>/ (the warm start in `warmstart/`,
GRPO's checkpoints), evaluates each model greedily on the held-out questions at N objectives
(the same questions, config and turn limits the tables use), and writes, per (workflow, model):

- OUT/<workflow>-<model>-N<n>.jsonl: one line per episode: the question's objectives (hops,
  facts, golds), the answer and each part's EM, the end reason, turns, every query, what each
  observation retrieved, every memory (workflows that carry one) and, per objective, whether
  its subject was searched, each hop's fact retrieved, each fact still held at the end.
- a summary printed and written to OUT/summary.md: end reasons, searches per episode, the share
  of objectives searched / retrieved / held at the end / answered, and for memory workflows
  how often a memory update drops a needed fact it had (in its old memory or its observation).

The facts are the world's supporting sentences (`facts` of each objective row); "held" means
the sentence appears verbatim in the final context's memory (memsearcher, memory_ops) or in
some observation of the episode (react, mem1: the context holds what it holds).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import ml_collections

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.paper_tables import eval_config  # noqa: E402
from memsearcher_jax.agent.parsing import extract_boxed, parse_tool_calls  # noqa: E402
from memsearcher_jax.data.synthetic import objectives_of  # noqa: E402
from memsearcher_jax.experiment import (  # noqa: E402
    build_sampler,
    build_setup,
    eval_runner,
    evaluate,
    sampling_mesh,
    with_objectives,
)
from memsearcher_jax.jobs import restore_policy  # noqa: E402
from memsearcher_jax.models import from_pretrained  # noqa: E402
from memsearcher_jax.qa_metrics import exact_match, split_answers  # noqa: E402

MEMORY_WORKFLOWS = ("memsearcher", "memory_ops")


def run_config(run: str, workflow: str):
    """The workflow's config as paper_tables ran it (OUT/settings.json holds every workflow's)."""
    with open(os.path.join(run, "settings.json"), encoding="utf-8") as f:
        settings = json.load(f)
    cfg = ml_collections.ConfigDict(settings["workflow_configs"][workflow])
    cfg.train.output_dir = os.path.join(run, workflow)
    return cfg


def observations(conv, builder) -> list[str]:
    """The decoded injected spans (loss mask 0) of a conversation, in order."""
    spans, cur = [], []
    for tok, m in zip(conv.response_ids, conv.loss_mask):
        if m == 0:
            cur.append(tok)
        elif cur:
            spans.append(builder.decode(cur))
            cur = []
    if cur:
        spans.append(builder.decode(cur))
    return spans


def episode(t, row, builder, workflow: str) -> dict:
    """One episode's account (see the module docstring)."""
    objs = objectives_of(row)
    acts = [b for c in t.conversations for b in c.blocks if "<memory>" not in b and "<ops>" not in b]
    queries = [c.query for b in acts for c in parse_tool_calls(b)]
    obs = [o for c in t.conversations for o in observations(c, builder)]
    seen = " ".join(obs)
    answer = extract_boxed(t.final.blocks[-1]) if t.final.blocks else None
    parts = split_answers(answer or "", len(objs))
    final_memory = t.memories[-1] if t.memories else ""
    held_text = final_memory if workflow in MEMORY_WORKFLOWS else seen
    per_obj = []
    for o, part in zip(objs, parts):
        per_obj.append({
            "question": o["question"], "hops": int(o["hops"]), "gold": o["golden_answers"][0], "answer": part,
            "em": exact_match(part, o["golden_answers"]),
            "searched_subject": any(o["subject"] in q for q in queries),
            "retrieved": [f in seen for f in o["facts"]],
            "held": [f in held_text for f in o["facts"]],
            "gold_in_memory": o["golden_answers"][0] in final_memory,
        })
    drops = []
    if workflow in MEMORY_WORKFLOWS:
        facts = [f for o in objs for f in o["facts"]]
        prev = ""
        for i, mem in enumerate(t.memories):
            ob = obs[i] if i < len(obs) else ""
            had = [f for f in facts if f in prev or f in ob]
            drops.append({"had": len(had), "kept": sum(f in mem for f in had)})
            prev = mem
    return {"question": row["question"], "answer": answer, "end_reason": t.end_reason, "turns": t.turns,
            "searches": t.num_searches, "queries": queries, "memories": list(t.memories),
            "memory_tokens": list(t.memory_tokens), "objectives": per_obj, "updates": drops,
            "peak_tokens": t.peak_tokens}


def summarize(eps: list[dict]) -> dict:
    n = max(1, len(eps))
    objs = [o for e in eps for o in e["objectives"]]
    m = max(1, len(objs))
    ups = [u for e in eps for u in e["updates"]]
    had = sum(u["had"] for u in ups)
    return {
        "episodes": len(eps),
        "end_reasons": dict(collections.Counter(e["end_reason"] for e in eps).most_common()),
        "searches": sum(e["searches"] for e in eps) / n,
        "turns": sum(e["turns"] for e in eps) / n,
        "answered": sum(e["answer"] is not None for e in eps) / n,
        "obj_em": sum(o["em"] for o in objs) / m,
        "obj_searched": sum(o["searched_subject"] for o in objs) / m,
        "obj_all_retrieved": sum(all(o["retrieved"]) for o in objs) / m,
        "obj_all_held": sum(all(o["held"]) for o in objs) / m,
        "em_if_all_held": (sum(o["em"] for o in objs if all(o["held"]))
                           / max(1, sum(all(o["held"]) for o in objs))),
        "em_if_not_held": (sum(o["em"] for o in objs if not all(o["held"]))
                           / max(1, sum(not all(o["held"]) for o in objs))),
        "update_keep_rate": (sum(u["kept"] for u in ups) / had) if had else None,
        "answer_parts_distinct": sum(len({o["answer"] for o in e["objectives"]}) == len(e["objectives"])
                                     for e in eps) / n,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="a bench/paper_tables.py --out directory")
    ap.add_argument("--workflows", default="memsearcher,react")
    ap.add_argument("--models", default="warm_start,grpo")
    ap.add_argument("--objectives", type=int, default=2)
    ap.add_argument("--questions", type=int, default=100)
    ap.add_argument("--out", default=None, help="default: RUN/episode_report")
    args = ap.parse_args(argv)
    out = args.out or os.path.join(args.run, "episode_report")
    os.makedirs(out, exist_ok=True)
    lines = []
    for wf in args.workflows.split(","):
        cfg = run_config(args.run, wf)
        setup = build_setup(cfg)
        setup_n = with_objectives(setup, args.objectives, seed=cfg.world.seed)
        ecfg = eval_config(cfg, args.objectives)
        for which in args.models.split(","):
            if which == "warm_start":
                model = from_pretrained(os.path.join(cfg.train.output_dir, "warmstart"), dtype=cfg.model.dtype,
                                        param_dtype=cfg.model.param_dtype)
            else:
                model, _ = restore_policy(cfg.train.output_dir)
            sampler = build_sampler(cfg, model, sampling_mesh(cfg))
            rows = setup_n.eval_questions[:args.questions]
            got = evaluate(eval_runner(ecfg, setup_n, sampler), rows)
            eps = [episode(t, row, setup.builder, wf) for t, row in zip(got["trajectories"], rows)]
            path = os.path.join(out, f"{wf}-{which}-N{args.objectives}.jsonl")
            with open(path, "w", encoding="utf-8") as f:
                for e in eps:
                    f.write(json.dumps(e) + "\n")
            s = summarize(eps)
            line = f"{wf} {which} N={args.objectives}: " + json.dumps(s)
            print(line, flush=True)
            lines.append(line)
    with open(os.path.join(out, "summary.md"), "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
