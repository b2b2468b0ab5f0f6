"""Where a workflow's episodes fail: a per-episode account of a trained model's greedy runs, or of
the sampled training episodes GRPO learns from.

    python bench/episode_report.py --run runs/paper_tables --workflows memsearcher,react \
        [--models warm_start,grpo] [--objectives 2] [--questions 100] [--sampled [--seed 123]] [--out DIR]

Reads the runs `bench/paper_tables.py` left in RUN/<workflow>/ (the warm start in `warmstart/`,
GRPO's checkpoints) and runs each model on N-objective questions:

- by default greedily on the held-out questions (the same questions, config and turn limits the
  tables use), scored as evaluation scores them;
- with `--sampled`, as GRPO's rollouts run: the run's training config (agent.temperature, top_p,
  agent.max_turns, memory budget), one sample per training question (the first --questions of
  the training questions joined N at a time), sampling seed --seed, scored by the trainer's
  reward (`rl.reward_fn`, `rl.grpo.score_trajectories`).

It writes, per (workflow, model):

- OUT/<workflow>-<model>-N<n>.jsonl (greedy) or OUT/<workflow>-<model>-N<n>-sampled-seed<s>.jsonl:
  one line per episode: the question's objectives (hops, facts, golds), the answer and each
  part's EM, the reward and the scorer's failure (None when the format passed), whether the
  failing block is a memory update closed by `</think>`, the end reason, turns, every query and
  how many repeat an earlier one, what each observation retrieved, every memory (workflows that
  carry one) and, per objective, whether its subject was searched, each hop's fact retrieved,
  each fact still held at the end.
- a summary printed and appended to OUT/summary.md, its line naming the mode: end reasons, reward,
  format failures by reason (episodes, mean searches and reward), memory updates closed by
  `</think>`, searches and repeated queries per episode, the share of objectives searched /
  retrieved / held at the end / answered, the same split by 1-hop and 2-hop objectives (subject
  searched, each hop retrieved), and for memory workflows how often a memory update drops a
  needed fact it had (in its old memory or its observation) and how often a sentence it adds
  appears in no observation of its turn (written, not read).

OUT follows every writer's rules (docs/usage.md, "your files"): a new or empty directory, or one
an earlier episode_report wrote (its marker, `.memsearcher-episode-report`: its reports of the same
name are replaced, its summary.md appended to); never a file, a training run's directory, or RUN
itself. Each file is written beside itself and renamed over it (a link there is replaced, never
written through). Every refusal, and a workflow or model RUN does not hold, is one line and exit 2
before any model loads.

The facts are the world's supporting sentences (`facts` of each objective row); "held" means
the sentence appears verbatim in the final context's memory (memsearcher, memory_ops) or in
some observation of the episode (react, mem1: the context holds what it holds).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.paper_tables import eval_config  # noqa: E402
from memsearcher_jax.agent.parsing import extract_boxed, parse_tool_calls  # noqa: E402
from memsearcher_jax.app.experiment import (  # noqa: E402
    build_sampler,
    build_setup,
    eval_runner,
    evaluate,
    load_reward_fn,
    sampling_mesh,
    training_runner,
    with_objectives,
)
from memsearcher_jax.app.jobs import checked_checkpoint, restore_policy  # noqa: E402
from memsearcher_jax.data.demos import FACT_SHAPED_NO_RESULT, NO_RESULT_NOTE  # noqa: E402
from memsearcher_jax.data.synthetic import objectives_of  # noqa: E402
from memsearcher_jax.errors import UserInputError  # noqa: E402
from memsearcher_jax.models import from_pretrained  # noqa: E402
from memsearcher_jax.qa_metrics import compute_reward, exact_match, split_answers  # noqa: E402
from memsearcher_jax.rl.grpo import score_trajectories  # noqa: E402
from memsearcher_jax.rules.run_dir import (  # noqa: E402
    WARMSTART_DIR,
    check_marked_out,
    is_same_or_parent,
    prepare_marked_out,
    replaced,
    write_text,
)
from memsearcher_jax.settings import SECTIONS, Settings  # noqa: E402

MEMORY_WORKFLOWS = ("memsearcher", "memory_ops")
MODELS = ("warm_start", "grpo")
# The format gate names the block it failed on ("block 3: unbalanced <think> tags").
FAILED_BLOCK = re.compile(r"^block (\d+): ")
MARKER = ".memsearcher-episode-report"  # in OUT: this script wrote it (its reports may be replaced)
WRITER = "episode_report"
# A report's name (report_name) and the summary: what an OUT from before the marker holds.
OWN_FILES = re.compile(r"[\w-]+-N\d+(-sampled-seed\d+)?\.jsonl$|summary\.md$")


def run_config(run: str, workflow: str):
    """The workflow's config as paper_tables ran it (OUT/settings.json holds every workflow's)."""
    path = os.path.join(run, "settings.json")
    try:
        with open(path, encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, ValueError) as e:
        raise UserInputError(f"--run {run}: cannot read {path} ({type(e).__name__}); expected a "
                             "bench/paper_tables.py --out directory") from None
    if workflow not in settings.get("workflow_configs", {}):
        raise UserInputError(f"--workflows {workflow}: {path} holds no such workflow; it has "
                             f"{', '.join(settings.get('workflow_configs', {})) or 'none'}")
    recorded = settings["workflow_configs"][workflow]
    # The report's settings, built once: a config recorded before a key existed gets that key at its
    # default, a section it does not record (a partial record) the section's defaults.
    s = Settings(**{name: SECTIONS[name].from_section(section) for name, section in recorded.items()
                    if name in SECTIONS and section is not None})
    return s.with_values({"train.output_dir": os.path.join(run, workflow)})


def report_name(workflow: str, model: str, objectives: int, sampled: bool, seed: int) -> str:
    """The JSONL of one (workflow, model, N): a sampled report (per seed) never takes a greedy one's name."""
    return f"{workflow}-{model}-N{objectives}" + (f"-sampled-seed{seed}" if sampled else "") + ".jsonl"


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


def failure_reason(failure: str | None) -> str | None:
    """The scorer's failure without the block it names, so that failures group by kind."""
    return FAILED_BLOCK.sub("", failure) if failure else None


def memory_closed_by_think(block: str) -> bool:
    """A memory update opened with `<memory>` whose first closing tag is `</think>`, not `</memory>`
    (e.g. `<memory>X: no result.</think>`: a sampled update written as a think)."""
    text = block.lstrip()
    if not text.startswith("<memory>"):
        return False
    think, memory = text.find("</think>"), text.find("</memory>")
    return think >= 0 and (memory < 0 or think < memory)


def failing_block(blocks, failure: str | None) -> str | None:
    """The final conversation's block the scorer's failure names, if it names one."""
    m = FAILED_BLOCK.match(failure or "")
    return blocks[int(m.group(1))] if m and int(m.group(1)) < len(blocks) else None


# The demonstrator's no-result notes (either wording): written by design, read from no observation.
NO_RESULT = re.compile("|".join(re.escape(n).replace(re.escape("{s}"), r"\S+")
                                for n in (NO_RESULT_NOTE, FACT_SHAPED_NO_RESULT)))


def sentences(memory: str) -> list[str]:
    """A memory's sentences (the world's facts each end with a full stop)."""
    return [x for x in re.split(r"(?<=\.)\s+", memory.strip()) if x]


def episode(t, row, builder, workflow: str, result=None) -> dict:
    """One episode's account (see the module docstring). result: its RewardResult (None: scored
    here by compute_reward, the reward training and evaluation use by default)."""
    result = result if result is not None else score_trajectories([t], compute_reward)[0]
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
            new = [x for x in sentences(mem) if x not in prev and not NO_RESULT.fullmatch(x)]
            drops.append({"had": len(had), "kept": sum(f in mem for f in had), "new": len(new),
                          "unsupported": sum(x not in ob for x in new)})
            prev = mem
    failed = failing_block(t.final.blocks, result.failure)
    return {"question": row["question"], "answer": answer, "end_reason": t.end_reason, "turns": t.turns,
            "reward": float(result.reward), "failure": result.failure,
            "memory_closed_by_think": failed is not None and memory_closed_by_think(failed),
            "searches": t.num_searches, "queries": queries, "repeated_queries": len(queries) - len(set(queries)),
            "memories": list(t.memories), "memory_tokens": list(t.memory_tokens), "objectives": per_obj,
            "updates": drops, "peak_tokens": t.peak_tokens}


def failures(eps: list[dict]) -> dict:
    """Format failures by reason, most frequent first: episodes, their mean searches and reward."""
    by = collections.defaultdict(list)
    for e in eps:
        if e["failure"]:
            by[failure_reason(e["failure"])].append(e)
    return {r: {"episodes": len(es), "searches": sum(e["searches"] for e in es) / len(es),
                "reward": sum(e["reward"] for e in es) / len(es)}
            for r, es in sorted(by.items(), key=lambda kv: -len(kv[1]))}


def by_hops(objs: list[dict]) -> dict:
    """Per hop count ("1-hop", "2-hop"): objectives, the share whose subject was searched and, per
    hop, the share whose fact was retrieved."""
    out = {}
    for hops in sorted({o["hops"] for o in objs}):
        group = [o for o in objs if o["hops"] == hops]
        out[f"{hops}-hop"] = {"objectives": len(group),
                              "searched": sum(o["searched_subject"] for o in group) / len(group),
                              "retrieved": [sum(o["retrieved"][h] for o in group) / len(group) for h in range(hops)]}
    return out


def summarize(eps: list[dict]) -> dict:
    n = max(1, len(eps))
    objs = [o for e in eps for o in e["objectives"]]
    m = max(1, len(objs))
    ups = [u for e in eps for u in e["updates"]]
    had = sum(u["had"] for u in ups)
    answered = [e for e in eps if e["answer"] is not None]
    return {
        "episodes": len(eps),
        "end_reasons": dict(collections.Counter(e["end_reason"] for e in eps).most_common()),
        "reward": sum(e["reward"] for e in eps) / n,
        "failed": sum(bool(e["failure"]) for e in eps),
        "failures": failures(eps),
        "memory_closed_by_think": sum(e["memory_closed_by_think"] for e in eps),
        "searches": sum(e["searches"] for e in eps) / n,
        "repeated_queries": sum(e["repeated_queries"] for e in eps) / n,
        "turns": sum(e["turns"] for e in eps) / n,
        "answered": len(answered) / n,
        "obj_em": sum(o["em"] for o in objs) / m,
        "obj_searched": sum(o["searched_subject"] for o in objs) / m,
        "obj_all_retrieved": sum(all(o["retrieved"]) for o in objs) / m,
        "obj_all_held": sum(all(o["held"]) for o in objs) / m,
        "by_hops": by_hops(objs),
        "em_if_all_held": (sum(o["em"] for o in objs if all(o["held"]))
                           / max(1, sum(all(o["held"]) for o in objs))),
        "em_if_not_held": (sum(o["em"] for o in objs if not all(o["held"]))
                           / max(1, sum(not all(o["held"]) for o in objs))),
        "update_keep_rate": (sum(u["kept"] for u in ups) / had) if had else None,
        # New memory sentences (no-result notes aside) found in no observation of their turn: a fact
        # written from the query or another document instead of read ("Pebas has the job of baker."
        # where the document said writer).
        "update_unsupported_rate": (sum(u["unsupported"] for u in ups) / max(1, sum(u["new"] for u in ups))
                                    if ups else None),
        # Over the episodes that answered: one cut off at the turn limit has no parts to compare.
        "answer_parts_distinct": (sum(len({o["answer"] for o in e["objectives"]}) == len(e["objectives"])
                                      for e in answered) / len(answered)) if answered else None,
    }


def run_episodes(cfg: Settings, setup_n, sampler, args) -> tuple[list[dict], list, list, str]:
    """(questions, trajectories, their RewardResults, the mode in words) for one model."""
    if args.sampled:
        # GRPO's rollouts: the training turn loop, the training questions, and the trainer's reward.
        runner = training_runner(cfg, setup_n, sampler)
        agent = runner.config
        rows, reward_fn, seed = setup_n.train_questions[:args.questions], load_reward_fn(cfg.rl.reward_fn), args.seed
        mode = (f"sampled (training questions, temperature {agent.temperature}, top_p {agent.top_p}, "
                f"{agent.max_turns} turns, seed {seed})")
    else:
        ecfg = eval_config(cfg, args.objectives)
        runner, rows = eval_runner(ecfg, setup_n, sampler), setup_n.eval_questions[:args.questions]
        reward_fn, seed = compute_reward, 0  # what evaluation scores; greedy needs no seed
        mode = f"greedy (held-out questions, {ecfg.agent.eval_max_turns} turns)"
    trajs = evaluate(runner, rows, seed=seed)["trajectories"]
    return rows, trajs, score_trajectories(trajs, reward_fn), mode


def parse_args(argv):
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--run", required=True, help="a bench/paper_tables.py --out directory (required)")
    ap.add_argument("--workflows", default="memsearcher,react", help="comma-separated workflows of the run")
    ap.add_argument("--models", default="warm_start,grpo", help="comma-separated, of: " + ", ".join(MODELS))
    ap.add_argument("--objectives", type=int, default=2, help="questions asked at once in each episode")
    ap.add_argument("--questions", type=int, default=100, help="episodes per (workflow, model)")
    ap.add_argument("--sampled", action="store_true",
                    help="sample training episodes as GRPO's rollouts do, instead of greedy held-out ones")
    ap.add_argument("--seed", type=int, default=123, help="the sampling seed of --sampled")
    ap.add_argument("--out", default=None, help="where the reports go (none given: RUN/episode_report)")
    args = ap.parse_args(argv)
    if args.objectives < 1 or args.questions < 1:
        raise UserInputError(f"--objectives {args.objectives} --questions {args.questions}: expected whole "
                             "numbers >= 1")
    bad = [m for m in args.models.split(",") if m not in MODELS]
    if bad:
        raise UserInputError(f"--models {args.models}: {', '.join(bad)} unknown; expected some of {', '.join(MODELS)}")
    return args


def check_out(out: str, run: str) -> None:
    """Refuse an OUT this script must not write in (run_dir.check_marked_out), and RUN itself."""
    if is_same_or_parent(out, run):
        raise UserInputError(f"--out {out} is (or holds) the --run directory {run}: give a directory of its own "
                             f"(by default {os.path.join(run, 'episode_report')})")
    path = os.path.abspath(os.path.expanduser(out))
    older = os.path.isdir(path) and all(OWN_FILES.match(n) for n in os.listdir(path))
    hint = f", or, if an episode_report from before its marker wrote it, mark it (touch {os.path.join(path, MARKER)})"
    check_marked_out(out, MARKER, WRITER, hint=hint if older else "")


def check_models(cfg: Settings, workflow: str, models: list[str]) -> None:
    """Each model the report runs is in the workflow's run directory (paper_tables trains the
    workflows it is given: RUN may hold some only), before any is loaded."""
    run_dir = cfg.train.output_dir
    for which in models:
        if which == "warm_start" and not os.path.isfile(os.path.join(run_dir, WARMSTART_DIR, "config.json")):
            raise UserInputError(f"--workflows {workflow} --models warm_start: {os.path.join(run_dir, WARMSTART_DIR)} "
                                 "holds no warm start: run bench/paper_tables.py with this --out and --workflows "
                                 f"{workflow} first, or leave {workflow} out")
        if which == "grpo":
            try:
                checked_checkpoint(run_dir, fix="remove that step to report on the one before")
            except FileNotFoundError as e:
                raise UserInputError(f"--workflows {workflow} --models grpo: {run_dir} holds no GRPO checkpoint ({e}): "
                                     "run bench/paper_tables.py with this --out and --workflows "
                                     f"{workflow} first, or leave {workflow} out") from None


def write_reports(out: str, reports: dict[str, list[dict]], lines: list[str]) -> None:
    """Each report (name -> episodes) and the summary lines appended to summary.md, in OUT with its
    marker (checked again: the episodes may have taken hours); each file replaced whole."""
    path = prepare_marked_out(out, MARKER, WRITER, [*reports, "summary.md"], written_by="bench/episode_report.py")
    for name, eps in reports.items():
        with replaced(os.path.join(path, name)) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for e in eps:
                f.write(json.dumps(e) + "\n")
    summary = os.path.join(path, "summary.md")
    earlier = ""
    if os.path.isfile(summary):
        with open(summary, encoding="utf-8") as f:
            earlier = f.read()
    write_text(summary, earlier + "\n".join(lines) + "\n")


def main(argv=None):
    args = parse_args(argv)
    out = args.out or os.path.join(args.run, "episode_report")
    cfgs = {wf: run_config(args.run, wf) for wf in args.workflows.split(",")}  # every one read before any load
    for wf, cfg in cfgs.items():
        if args.sampled and not cfg.agent.temperature > 0:
            raise UserInputError(f"--sampled: {wf}'s run has agent.temperature={cfg.agent.temperature}; sampled "
                                 "episodes need a temperature > 0 (GRPO's)")
    check_out(out, args.run)
    for wf, cfg in cfgs.items():
        check_models(cfg, wf, args.models.split(","))
    lines, reports = [], {}
    for wf, cfg in cfgs.items():
        setup = build_setup(cfg)
        setup_n = with_objectives(setup, args.objectives, seed=cfg.world.seed)
        for which in args.models.split(","):
            if which == "warm_start":
                model = from_pretrained(os.path.join(cfg.train.output_dir, "warmstart"), dtype=cfg.model.dtype,
                                        param_dtype=cfg.model.param_dtype)
            else:
                model, _ = restore_policy(cfg.train.output_dir)
            sampler = build_sampler(cfg, model, sampling_mesh(cfg))
            rows, trajs, results, mode = run_episodes(cfg, setup_n, sampler, args)
            eps = [episode(t, row, setup.builder, wf, r) for t, row, r in zip(trajs, rows, results)]
            reports[report_name(wf, which, args.objectives, args.sampled, args.seed)] = eps
            line = f"{wf} {which} N={args.objectives} {mode}: " + json.dumps(summarize(eps))
            print(line, flush=True)
            lines.append(line)
    write_reports(out, reports, lines)


def cli(argv=None) -> int:
    """main() as a command: bad input is one line on stderr and exit 2, not a traceback."""
    try:
        main(argv)
    except UserInputError as e:
        print(f"episode_report: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
