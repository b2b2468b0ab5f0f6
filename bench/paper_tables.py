"""The papers' claims, measured: every workflow trained the same way, in four tables.

    python bench/paper_tables.py [--quick] [--workflows memsearcher,react,mem1,memory_ops,summary,fold]
                                 [--out runs/paper_tables] [--config configs/default.py] [--config.x=v ...]

From the same shipped base, world, steps, B and G, each workflow is warm-started on its own
scripted demonstrations (its own format, the same flaws), then trained with GRPO by the default
job (`jobs.train_job`) on 1 to 4 questions at once in equal shares (world.objectives_mix=1,2,3,4,
which the bench sets; with --config.world.objectives_mix='' on `--train-objectives` questions at
once). `--train-objectives` (2) is also the count of Table 1's token columns and of Table 4. Each
model is then evaluated greedily on the held-out questions:

- Table 1: per workflow, held-out EM and F1 at 1 and 2 objectives, peak tokens, tokens per
  question, GRPO minutes; a "warm start only" row per workflow (the model GRPO started from).
- Table 2: prompt tokens per act call by turn (mean / max) per workflow, at 4 objectives when
  they are evaluated, else at `--train-objectives` (MemSearcher's claim: flat for a memory agent,
  growing for ReAct).
- Table 3: EM per objective and peak tokens at 1, 2, 4 and 8 objectives (MEM1's claim).
- Table 4: memsearcher EM against its memory budget (agent.memory_budget), by default the
  trained memsearcher model evaluated at each budget; `--budget-training` trains one per budget.

Episodes get room for the task: training runs max(agent.max_turns, 2N+2) turns at N objectives
(a 2-hop question needs two searches, plus the answer and one spare), and enough for the largest
demonstration (2M+1 at M objectives); evaluation max(agent.eval_max_turns, 2N+3). With
--config.agent.turns_per_question=K each episode has its own budget instead (the library's rule:
max_turns for one question, K more for each further one; evaluation from agent.eval_max_turns).
--config.world.objectives_schedule='0:1,2;20:2,4;40:4,8' trains GRPO on a schedule of question counts
in place of the bench's mix; --config.agent.hint and --config.rl.aggregation pass through as they are.
Results go to OUT/results.json and OUT/tables.md (with the date and the command), and
OUT/prompt_tokens_by_turn.png; each workflow's run lives in OUT/<workflow>/.

Resumable: every (workflow, phase) result (its training, each evaluation) is written to
OUT/phases/<workflow>/<phase>.json when it finishes, and the same command run again skips those
(saying so) and resumes an unfinished GRPO from its last checkpoint. OUT/settings.json holds what
the results depend on (the config, training objectives, questions per evaluation); a rerun with
other settings is refused. Workflows, objective counts and budgets may be added on a rerun.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import jax

from memsearcher_jax.agent.config import episode_turns
from memsearcher_jax.agent.workflows import workflow_names
from memsearcher_jax.app.curves import plot_prompt_tokens_by_turn, read_metrics
from memsearcher_jax.app.experiment import (
    TrainConfigError,
    build_sampler,
    build_setup,
    demo_objective_counts,
    eval_runner,
    evaluate,
    sampling_mesh,
    train_objective_counts,
    validate,
    with_objectives,
)
from memsearcher_jax.app.jobs import restore_policy, train_job
from memsearcher_jax.app.rft import rft_control
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.models import from_pretrained, save_pretrained
from memsearcher_jax.rl.evaluation import COVERAGE_KEYS
from memsearcher_jax.rules.config_rules import settings_of as settings_of_config  # paper_tables has a settings_of
from memsearcher_jax.rules.run_dir import (
    STAGING_PREFIX,
    config_record,
    existing_parent,
    prepare_output_dir,
    replaced,
    write_json,
    write_text,
)
from memsearcher_jax.settings import Settings
from memsearcher_jax.settings.config_utils import load_config, split_overrides

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.paper_targets import target_lines  # noqa: E402

WORKFLOWS = ("memsearcher", "react", "mem1", "memory_ops", "summary", "fold")
OBJECTIVES = (1, 2, 4, 8, 16)
BUDGETS = (16, 32, 64, 128)
# --quick: every table in a small version. The warm start and GRPO keep enough steps that the
# trained memsearcher answers (the default's 150 SFT / 30 GRPO steps of 16 x 5 reach held-out EM
# ~78); fewer questions per evaluation, objective counts 1, 2 and 8, two memory budgets.
# The bench's own settings, under --quick's and the command line's (which win). The warm start takes
# 3 passes over its rows for every workflow (sft.passes): one row per turn for memsearcher (~2.5k:
# 469 steps), one per episode for react (600: 113 steps); equal steps were not equal passes. After
# one pass memsearcher's update copied the old memory whole in 69% of pair updates (teacher-forced),
# after three in 96%. Every demonstration's entity names are swapped for names the world never uses
# (sft.name_swap_rate=1; a base without a reading vocabulary needs --config.sft.name_swap_rate=0):
# trained on the world's training names the warm start wrote them for held-out ones ("Negin makes"
# for Pebacorp), and at 2 objectives searched the asked subject for 57% of held-out objectives against
# 98% swapped (docs/lab/2026-11-29-memsearcher-worse-at-pairs.md).
#
# GRPO trains on a mix of 1-4 questions at once, not on pairs alone: trained on pairs, a model keeps
# the warm start's habit of answering a single question without searching (the demonstrator's
# early-answer flaw), which GRPO never sees; greedy at 1 objective both models searched 0 times.
# React's warm-start rows (one per episode, up to ~1500 tokens) took 15-18 GB in one program per batch
# of 16 and were killed beside another run on a 24 GB machine: batches over 8192 padded tokens take
# their update from micro-batches (memsearcher's, at most 16 x 512, never split).
# A search that found nothing leaves the fact-shaped note "X: no result." in memory: worded as the
# default's "Nothing found about X yet." sampled pair updates closed it with </think> (7 of 64 against 2;
# docs/lab/2026-11-29-four-designs-seed0-and-sampled-episodes.md). The tables since 2026-11-29 use it.
BENCH = {"sft.passes": 3, "sft.name_swap_rate": 1.0, "sft.max_batch_tokens": 8192, "world.objectives_mix": "1,2,3,4",
         "sft.no_result_note": "{s}: no result."}
QUICK = {"sft.passes": 0, "sft.steps": 100, "sft.num_demos": 400, "train.steps": 10, "rl.batch_questions": 8,
         "rl.group_size": 4, "rl.micro_batch_size": 16, "train.save_every": 5}
QUICK_EVAL_QUESTIONS = 30
QUICK_OBJECTIVES = (1, 2, 8)
QUICK_BUDGETS = (16, 64)
# Every workflow gets the same room per call and per conversation, enough for react's full history at
# 8 objectives (18 turns), so that no design is cut short by a cap the others never reach: the
# shipped base's position limit (max_position_embeddings 4096; it was pretrained on rows of <= 512
# tokens, so longer react contexts also test whether it reads past that).
CONTEXT_ROOM = 4096
MODEL_DIRS = {"warm_start": "warmstart", "rft": "rft"}  # the models kept as HF directories in OUT/<workflow>/
SCALARS = ("em", "f1", "reward", "format_ok", "turns", "searches", "peak_tokens", "peak_tokens_max",
           "tokens_per_question")
# How much of each task an episode searched (rl/evaluation.py:coverage_metrics) and the passages it read:
# in every evaluation since issue 83; a phase evaluated before has none (its cells show "—").
COVERAGE = COVERAGE_KEYS
READING_THRESHOLD = 0.95  # the base's reading probe at or above this reads a context well (issue 24's bar)


# ----------------------------------------------------------------------------- configs

def workflow_config(base: Settings, workflow: str, out_dir: str, train_objectives: int,
                    memory_budget: int | None = None) -> Settings:
    """base with this workflow, its own output dir, N training objectives, turns for them and
    CONTEXT_ROOM tokens per call and per conversation."""
    cfg = base.with_values({"agent.workflow": workflow, "world.objectives": train_objectives})
    if not cfg.sft.demo_objectives and train_objectives > 1:
        # The warm start shows 1 to max(4, N) questions at once in equal shares: single questions (an
        # instruct LLM, MEM1's start, answers those already: a base shown only pairs answers every
        # question with two answers, EM 0 at 1), and more than the training count, so that the
        # format and the habit of searching every question reach the counts evaluated.
        cfg = cfg.with_values({"sft.demo_objectives": ",".join(str(k) for k in range(1, max(4, train_objectives) + 1))})
    # Turns and memory cover the largest demonstration too (4 objectives: 9 turns, ~70 tokens of
    # facts), so that the warm start never shows an episode the workflow would cut short.
    most = max(train_objectives, *demo_objective_counts(cfg), *train_objective_counts(cfg))
    agent = cfg.agent
    if agent.turns_per_question:  # a budget per count (AgentConfig.episode_turns): max_turns is one question's
        max_turns = max(agent.max_turns, turns_for(1))
    else:
        max_turns = max(agent.max_turns, turns_for(most) - 1, turns_for(train_objectives))
    return cfg.with_values({
        "agent.max_turns": max_turns,
        "agent.max_context_tokens": max(agent.max_context_tokens, CONTEXT_ROOM),
        "agent.max_response_tokens": max(agent.max_response_tokens, CONTEXT_ROOM),
        "train.output_dir": out_dir,
        "train.eval_questions": 0,  # the bench evaluates itself, at every objective count
        "train.eval_every": 0,
        "agent.memory_budget": (memory_budget if memory_budget is not None
                                else max(agent.memory_budget, MEMORY_PER_OBJECTIVE * most))})


def turns_for(objectives: int) -> int:
    """Turns an episode of N objectives gets: a search per hop (2-hop questions need two), the
    answer, and one turn to spare for a search that found nothing: 2N + 2 (the library's rule,
    `episode_turns`, at agent.max_turns=4 and agent.turns_per_question=2)."""
    return episode_turns(4, 2, objectives)


# Memory each objective may take at evaluation: a 2-hop objective's two facts are ~20 tokens in the
# synthetic world. The budget is a cap the agent is not told, so a larger one changes nothing until
# a memory would exceed it; without it a memory agent could not hold 8 objectives' facts in the
# training budget (64) and would be cut where react, which has no budget, is not.
MEMORY_PER_OBJECTIVE = 32


def eval_config(cfg: Settings, objectives: int, memory_budget: int | None = None) -> Settings:
    """The evaluation at N objectives: N-objective questions, turns for them (one more than
    training's 2N+2) and a memory budget of at least MEMORY_PER_OBJECTIVE x N tokens (Table 4
    passes its own budget)."""
    changes = {"world.objectives": objectives,
               "agent.memory_budget": (memory_budget if memory_budget is not None
                                       else max(cfg.agent.memory_budget, MEMORY_PER_OBJECTIVE * objectives))}
    if not cfg.agent.turns_per_question:  # else each question after the first adds its turns to eval_max_turns
        changes["agent.eval_max_turns"] = max(cfg.agent.eval_max_turns, turns_for(objectives) + 1)
    return cfg.with_values(changes)


# ----------------------------------------------------------------------------- phases (resumable)

def phase_path(out: str, workflow: str, phase: str) -> str:
    """Where one (workflow, phase) result lives: OUT/phases/<workflow>/<phase>.json."""
    return os.path.join(out, "phases", workflow, phase + ".json")


def run_phase(path: str, compute, log=print):
    """The result at `path` if an earlier run wrote it (said as skipped), else compute() written
    there atomically (a run killed mid-write leaves no half file that a rerun would trust)."""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        log(f"  skipped (done earlier): {path}", flush=True)
        return result
    result = compute()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, result, indent=1)  # whole or not at all; a link at path is replaced, never written through
    return result


class ModelEvaluator:
    """evaluate(which, n, memory_budget): greedy held-out metrics of the warm-started ("warm_start")
    or GRPO-trained ("grpo") model of one workflow run at n objectives. Each model is loaded on
    first use, so a rerun whose evaluations are all done loads nothing."""

    def __init__(self, cfg: Settings, eval_questions: int):
        self.cfg, self.eval_questions, self.samplers, self.setup = cfg, eval_questions, {}, None

    def sampler(self, which: str):
        if which not in self.samplers:
            if which in ("warm_start", "rft"):  # HF directories: the warm start, the RFT control
                model = from_pretrained(os.path.join(self.cfg.train.output_dir, MODEL_DIRS[which]),
                                        dtype=self.cfg.model.dtype, param_dtype=self.cfg.model.param_dtype)
            else:
                model, _ = restore_policy(self.cfg.train.output_dir)
            self.samplers[which] = build_sampler(self.cfg, model, sampling_mesh(self.cfg))
        return self.samplers[which]

    def __call__(self, which: str, n: int, memory_budget: int | None = None) -> dict:
        cfg = self.cfg
        self.setup = self.setup or build_setup(cfg)
        ecfg = eval_config(cfg, n, memory_budget)
        setup_n = with_objectives(self.setup, n, seed=cfg.world.seed)
        got = evaluate(eval_runner(ecfg, setup_n, self.sampler(which)), setup_n.eval_questions[:self.eval_questions])
        print(f"  {cfg.agent.workflow} {which} {n} objective(s)"
              f"{'' if memory_budget is None else f', memory budget {memory_budget}'}: EM {100 * got['em']:.1f} "
              f"F1 {100 * got['f1']:.1f} peak tokens {got['peak_tokens']:.0f}", flush=True)
        return {**{k: float(got[k]) for k in SCALARS}, **{k: float(got[k]) for k in COVERAGE if k in got},
                "prompt_tokens_by_turn": got["prompt_tokens_by_turn"], "questions": len(got["results"])}


def timed_train(cfg: Settings) -> dict:
    """train_job (resuming whatever an earlier, killed run left), this call's wall time, and the
    GRPO steps' own time (rollout + log-probs + update) summed over every logged step: unlike the
    job's wall time it includes the steps of a stretch that was killed before a resume."""
    t0 = time.perf_counter()
    summary = train_job(cfg, resume=True)
    steps = read_metrics(cfg.train.output_dir)
    step_seconds = sum(m.get(k, 0.0) for m in steps for k in ("time_rollout", "time_logprobs", "time_update",
                                                                 "time_info"))
    return {**summary, "job_seconds": time.perf_counter() - t0, "grpo_step_seconds": step_seconds}


def timed_rft(cfg: Settings, grpo_seconds: float) -> dict:
    """The RFT control (memsearcher_jax/app/rft.py) from the warm start, for at least GRPO's time; the
    model is saved in OUT/<workflow>/rft/ (a HF directory) for the evaluations."""
    setup = build_setup(cfg)
    got = rft_control(cfg, setup, os.path.join(cfg.train.output_dir, "warmstart"), grpo_seconds)
    save_pretrained(got.model, os.path.join(cfg.train.output_dir, "rft"), tokenizer_dir=setup.tokenizer_dir)
    print(f"  {cfg.agent.workflow} RFT: kept {got.kept} of {got.sampled} trajectories ({got.rows} rows), "
          f"{got.steps} steps; sampling {got.sample_seconds / 60:.1f} min, "
          f"fine-tuning {got.train_seconds / 60:.1f} min", flush=True)
    return got.summary()


def run_workflow(cfg: Settings, objectives, out: str, evaluator, warm_objectives=None, name: str | None = None,
                 rft: bool = False) -> dict:
    """Warm start + GRPO by the default job, then the held-out evaluations of both models; every
    phase is read back from OUT/phases/<name>/ when an earlier run finished it, and an
    unfinished GRPO resumes from its last checkpoint (train_job's own resume)."""
    name = name or cfg.agent.workflow
    summary = run_phase(phase_path(out, name, "train"), lambda: timed_train(cfg))
    # GRPO minutes from the logged steps (every stretch of a resumed run), else the job's GRPO wall time.
    result = {"workflow": cfg.agent.workflow, "grpo_minutes": (summary.get("grpo_step_seconds")
                                                                or summary["grpo_seconds"]) / 60,
              "job_minutes": summary.get("job_seconds", 0.0) / 60}
    if warm_objectives is None:  # Table 1's columns
        warm_objectives = sorted({1, 2, cfg.world.objectives})
    if cfg.sft.steps > 0 and warm_objectives:
        result["warm_start"] = {n: run_phase(phase_path(out, name, f"warm_start@{n}"),
                                             lambda n=n: evaluator("warm_start", n)) for n in warm_objectives}
    result["grpo"] = {n: run_phase(phase_path(out, name, f"grpo@{n}"), lambda n=n: evaluator("grpo", n))
                      for n in objectives}
    if rft and cfg.sft.steps > 0:
        # Same rollout count as GRPO, at least its minutes (sampling included): RL against supervised
        # training on the policy's own successful episodes.
        seconds = (summary.get("grpo_step_seconds") or summary["grpo_seconds"])
        result["rft_run"] = run_phase(phase_path(out, name, "rft"), lambda: timed_rft(cfg, seconds))
        result["rft"] = {n: run_phase(phase_path(out, name, f"rft@{n}"), lambda n=n: evaluator("rft", n))
                         for n in sorted({1, 2, cfg.world.objectives})}
    return result


def budget_sweep(cfg: Settings, budgets, out: str, eval_questions: int, train_each: bool, evaluator=None) -> dict:
    """memsearcher EM at each memory budget: the trained model evaluated at each (default), or
    (train_each) a run trained at each budget; each budget is a phase of its own."""
    n = cfg.world.objectives
    if train_each:
        res = {}
        for b in budgets:
            name = f"memsearcher_budget{b}"
            bcfg = workflow_config(cfg, "memsearcher", os.path.join(out, name), n, memory_budget=b)
            if not os.path.exists(phase_path(out, name, "train")):
                share_warm_start(os.path.join(cfg.train.output_dir, "warmstart"), bcfg.train.output_dir)
            res[b] = run_workflow(bcfg, (n,), out, ModelEvaluator(bcfg, eval_questions), warm_objectives=(),
                                  name=name)["grpo"][n]
        return res
    evaluator = evaluator or ModelEvaluator(cfg, eval_questions)
    return {b: run_phase(phase_path(out, "memsearcher", f"budget{b}@{n}"), lambda b=b: evaluator("grpo", n, b))
            for b in budgets}


def share_warm_start(warm_start_dir: str, run_dir: str) -> bool:
    """Put memsearcher's warm start (an HF directory) into a budget run's directory, where
    train_job reuses a cached warm start instead of training one: the warm start reads no memory
    budget (the demonstrator writes its memories whatever the cap), so each budget's would be the
    same model, ~45 min of SFT on 2 cores each. False (nothing done) when there is none to share or
    the run already has its own. The copy lands whole or not at all (a temporary name, renamed)."""
    target = os.path.join(run_dir, "warmstart")
    if not os.path.isfile(os.path.join(warm_start_dir, "config.json")) or os.path.exists(target):
        return False
    prepare_output_dir(run_dir, fresh=False)  # the run's marker: train_job resumes in it as its own
    tmp = os.path.join(run_dir, STAGING_PREFIX + "warmstart")  # the staging name a run's --fresh clears too
    if os.path.exists(tmp):  # a copy killed midway: a staging directory, never a finished model
        shutil.rmtree(tmp)
    shutil.copytree(warm_start_dir, tmp)
    os.replace(tmp, target)
    print(f"  warm start shared from {warm_start_dir} (it reads no memory budget)", flush=True)
    return True


# ----------------------------------------------------------------------------- tables (pure)

def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def _num(x, fmt=".0f") -> str:
    return "—" if x is None else format(x, fmt)


def _get(d: dict, *keys):
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k, d.get(str(k)))
    return d


def table1(results: dict, train_objectives: int = 2) -> str:
    """Per workflow: GRPO row and warm-start row; EM/F1 at 1 and 2 objectives, peak tokens and
    tokens per question at the training objective count, GRPO minutes."""
    n = train_objectives
    lines = [f"| workflow | model | EM @1 | F1 @1 | EM @2 | F1 @2 | peak tokens @{n} | tokens / question @{n} | "
             "GRPO minutes |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for w, r in results.items():
        for label, key in (("GRPO", "grpo"), ("RFT (same rollouts)", "rft"), ("warm start only", "warm_start")):
            if key not in r:
                continue
            m = r[key]
            minutes = _num(r.get("grpo_minutes"), ".1f") if key == "grpo" else "—"
            lines.append(f"| {w} | {label} | {_pct(_get(m, 1, 'em'))} | {_pct(_get(m, 1, 'f1'))} | "
                         f"{_pct(_get(m, 2, 'em'))} | {_pct(_get(m, 2, 'f1'))} | {_num(_get(m, n, 'peak_tokens'))} | "
                         f"{_num(_get(m, n, 'tokens_per_question'))} | {minutes} |")
    return "\n".join(lines)


def table2(results: dict, objectives: int = 2) -> str:
    """Prompt tokens per act call by turn (mean / max, and episodes that reached it) per workflow."""
    by_wf = {w: _get(r, "grpo", objectives, "prompt_tokens_by_turn") or [] for w, r in results.items()}
    turns = max((row["turn"] for rows in by_wf.values() for row in rows), default=0)
    lines = ["| workflow | " + " | ".join(f"turn {t}" for t in range(1, turns + 1)) + " |",
             "|---|" + "---:|" * turns]
    for w, rows in by_wf.items():
        cells = {row["turn"]: f"{row['mean']:.0f} / {row['max']} (n={row['n']})" for row in rows}
        lines.append(f"| {w} | " + " | ".join(cells.get(t, "—") for t in range(1, turns + 1)) + " |")
    return "\n".join(lines)


def table3(results: dict, objectives=OBJECTIVES) -> str:
    """EM per objective and peak tokens at each objective count, per workflow (trained on 2)."""
    head = " | ".join(f"EM @{n} | peak @{n}" for n in objectives)
    lines = [f"| workflow | {head} |", "|---|" + "---:|---:|" * len(objectives)]
    for w, r in results.items():
        cells = " | ".join(f"{_pct(_get(r, 'grpo', n, 'em'))} | {_num(_get(r, 'grpo', n, 'peak_tokens'))}"
                           for n in objectives)
        lines.append(f"| {w} | {cells} |")
    return "\n".join(lines)


def table4(budgets: dict) -> str:
    """memsearcher EM / F1 / peak tokens against its memory budget."""
    lines = ["| memory budget (tokens) | EM | F1 | peak tokens | turns |", "|---:|---:|---:|---:|---:|"]
    for b, m in sorted(budgets.items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {b} | {_pct(m.get('em'))} | {_pct(m.get('f1'))} | {_num(m.get('peak_tokens'))} | "
                     f"{_num(m.get('turns'), '.2f')} |")
    return "\n".join(lines)


def table5(results: dict, objectives=OBJECTIVES) -> str:
    """Coverage per workflow, model and question count: the share of questions (and hops) the episodes
    searched, searches against the hops needed, early answers, and the passages and tokens read."""
    lines = ["| workflow | model | questions | searched | hops searched | searches / question | hops / question | "
             "searches / hop | early answers | passages (mean / max) | peak tokens (mean / max) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for w, r in results.items():
        for label, key in (("GRPO", "grpo"), ("warm start only", "warm_start")):
            for n in objectives:
                m = _get(r, key, n)
                if not isinstance(m, dict) or m.get("coverage") is None:
                    continue
                rate = lambda k: _num(m.get(k), ".2f")
                lines.append(f"| {w} | {label} | {n} | {_pct(m['coverage'])} | {_pct(m.get('hop_coverage'))} | "
                             f"{rate('searches_per_question')} | {rate('hops_per_question')} | "
                             f"{rate('searches_per_hop')} | {_pct(m.get('early_answer_rate'))} | "
                             f"{_num(m.get('passages'), '.1f')} / {_num(m.get('passages_max'))} | "
                             f"{_num(m.get('peak_tokens'))} / {_num(m.get('peak_tokens_max'))} |")
    return "\n".join(lines)


def reading_limit(base_dir: str, threshold: float = READING_THRESHOLD) -> dict:
    """What the base reads whole: its reading probe by passages shown (base_manifest.json's
    reading_probe: cloze questions on 2, 8, 16 passages in one context), the fewest probed passages
    where it falls below `threshold` (None: at none of them), and its context window (config.json's
    max_position_embeddings). A base without a manifest has no probe: by_length is then {}."""
    out = {"base": base_dir, "threshold": threshold, "by_length": {}, "below_at": None, "context_window": None}
    for name, read in (("base_manifest.json", lambda m: {"by_length": {
            int(k): float(v["accuracy"]) for k, v in (m.get("reading_probe") or {}).get("by_length", {}).items()}}),
                       ("config.json", lambda m: {"context_window": m.get("max_position_embeddings")})):
        path = os.path.join(os.path.expanduser(base_dir), name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                out.update(read(json.load(f)))
    out["by_length"] = dict(sorted(out["by_length"].items()))
    out["below_at"] = next((k for k, a in out["by_length"].items() if a < threshold), None)
    return out


def probe_at(limit: dict, passages: float) -> str:
    """The base's probe for a context of `passages` passages: its accuracy at the fewest probed
    passages that hold that many (it falls with length, so this is the most it can read there), or
    that the context is beyond the longest probe."""
    by_length = {int(k): a for k, a in sorted((limit.get("by_length") or {}).items(), key=lambda kv: int(kv[0]))}
    if not by_length:
        return "no probe"
    k = next((k for k in by_length if k >= passages), None)
    if k is None:
        longest = max(by_length)
        return f"beyond the probe ({100 * by_length[longest]:.1f}% at {longest})"
    return f"{100 * by_length[k]:.1f}% at {k}"


def reading_table(results: dict, limit: dict, objectives=OBJECTIVES, workflow: str = "react") -> str:
    """`workflow`'s history (the trained model's) per question count against what the base reads:
    passages and peak tokens (mean / max) and the base's probe at that many passages."""
    lines = ["| questions | history passages (mean / max) | peak tokens (mean / max) | the base's probe at the mean | "
             "at the max |", "|---:|---:|---:|---|---|"]
    for n in objectives:
        m = _get(results, workflow, "grpo", n)
        if not isinstance(m, dict) or m.get("passages") is None:
            continue
        lines.append(f"| {n} | {m['passages']:.1f} / {_num(m.get('passages_max'))} | {_num(m.get('peak_tokens'))} / "
                     f"{_num(m.get('peak_tokens_max'))} | {probe_at(limit, m['passages'])} | "
                     f"{probe_at(limit, m.get('passages_max') or 0)} |")
    return "\n".join(lines)


def reading_caption(limit: dict) -> str:
    """One sentence: the base's probe by length, where it falls below the threshold, its context window."""
    by_length = {int(k): a for k, a in sorted((limit.get("by_length") or {}).items(), key=lambda kv: int(kv[0]))}
    window = limit.get("context_window")
    tail = f"its context window is {window} tokens" if window else "its context window is not recorded"
    if not by_length:
        return f"The base ({limit.get('base')}) has no reading probe at k passages; {tail}."
    probe = " / ".join(f"{100 * a:.1f}" for a in by_length.values())
    where = (f"below {100 * limit['threshold']:.0f}% from {limit['below_at']} passages" if limit.get("below_at")
             else f"at or above {100 * limit['threshold']:.0f}% at every length probed")
    return (f"The base's reading probe reads {probe}% at {' / '.join(map(str, by_length))} passages ({where}; "
            f"nothing longer was probed); {tail}.")


TABLE2_OBJECTIVES = 4  # Table 2's count when evaluated: episodes long enough to show turn 6 and later


def table2_objectives(report: dict) -> int:
    """The objective count Table 2 (and its PNG) reads: 4 when the trained models were evaluated
    there, else the training count."""
    four = any(_get(r, "grpo", TABLE2_OBJECTIVES, "prompt_tokens_by_turn") for r in report["workflows"].values())
    return TABLE2_OBJECTIVES if four else report["train_objectives"]


def trained_on(report: dict) -> str:
    """The caption's training counts: GRPO's mix (world.objectives_mix) where one was set."""
    mix = report.get("train_mix", "")
    if mix:
        return f"GRPO trained on {', '.join(mix.split(','))} objectives in equal shares"
    return f"Trained on {report['train_objectives']} objectives"


def tables_markdown(report: dict) -> str:
    """Every table with its caption, the date and the command (what tables.md holds)."""
    res, n, n2 = report["workflows"], report["train_objectives"], table2_objectives(report)
    parts = [f"# Workflow tables ({report['date']})", "", f"Command: `{report['command']}`", "",
             f"Seed {report.get('seed', 0)}; base {report.get('base', '?')}; commit {report.get('git_commit', '?')}"
             f"{' (with uncommitted changes)' if report.get('git_dirty') else ''}.", "",
             f"{trained_on(report)}; {report['eval_questions']} held-out questions per evaluation (greedy).", "",
             "## Table 1: accuracy and context per workflow", "", table1(res, n), "",
             f"## Table 2: prompt tokens per act call by turn, mean / max (n = episodes), at {n2} objectives "
             "(the trained models)", "", table2(res, n2), "",
             "## Table 3: EM per objective and mean peak tokens by number of objectives", "",
             table3(res, tuple(report["objectives"])), ""]
    if report.get("budgets"):
        how = ("trained at each budget" if report.get("budget_training")
               else "the trained model evaluated at each budget")
        parts += [f"## Table 4: memsearcher against its memory budget ({how}; {n} objectives)", "",
                  table4(report["budgets"]), ""]
    if any(_get(r, key, k, "coverage") is not None for r in res.values() for key in ("grpo", "warm_start")
           for k in report["objectives"]):
        parts += ["## Table 5: coverage: how much of each task the episodes searched", "",
                  "A question counts as searched when a search query names its subject entity (a hop: its entity); "
                  "an early answer is one given while a question was still unsearched.", "",
                  table5(res, tuple(report["objectives"])), ""]
    if "react" in res and report.get("reading_probe"):
        parts += ["## Where react's history outgrows what the base reads", "", reading_caption(report["reading_probe"]),
                  "", reading_table(res, report["reading_probe"], tuple(report["objectives"])), ""]
    parts += ["## The papers' claims as targets (bench/paper_targets.py)", "", *target_lines(report, n2), ""]
    return "\n".join(parts)


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    rest, overrides = split_overrides(argv)
    epilog = ("--config.KEY=VALUE overrides any key of --config; the bench sets, before yours: "
              + " ".join(f"{k}={v}" for k, v in BENCH.items()) + "; and under --quick also: "
              + " ".join(f"{k}={v}" for k, v in QUICK.items()))
    ap = argparse.ArgumentParser(description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a minutes-long check of every table (tiny settings)")
    ap.add_argument("--workflows", default=",".join(WORKFLOWS), help="comma-separated workflows to train")
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs", "default.py"))
    ap.add_argument("--out", default="runs/paper_tables", help="output directory")
    ap.add_argument("--train-objectives", type=int, default=2,
                    help="questions at once in Table 1's token columns and Table 4 (Table 2 too when 4 is not "
                         "evaluated), and in GRPO's training questions only when world.objectives_mix is '' (the "
                         "bench trains on its mix: see below)")
    ap.add_argument("--objectives", default=None,
                    help=f"objective counts evaluated (default {','.join(map(str, OBJECTIVES))}; --quick "
                         f"{','.join(map(str, QUICK_OBJECTIVES))})")
    ap.add_argument("--budgets", default=None,
                    help=f"memory budgets of Table 4, '' for none (default {','.join(map(str, BUDGETS))}; --quick "
                         f"{','.join(map(str, QUICK_BUDGETS))})")
    ap.add_argument("--budget-training", action="store_true", help="Table 4: train one memsearcher per budget")
    ap.add_argument("--seeds", default="0",
                    help="comma-separated seeds (world and training: world.seed and train.seed); with several, each "
                         "runs into OUT/seed<S>/ and Table 1 gives the mean and spread over them (default 0)")
    ap.add_argument("--no-rft", action="store_true",
                    help="skip Table 1's RFT control (rejection-sampling fine-tuning on GRPO's number of rollouts)")
    ap.add_argument("--eval-questions", type=int, default=None,
                    help=f"held-out questions per evaluation (default: train.eval_questions; --quick "
                         f"{QUICK_EVAL_QUESTIONS})")
    args = ap.parse_args(rest)
    if args.objectives is None:
        args.objectives = ",".join(map(str, QUICK_OBJECTIVES if args.quick else OBJECTIVES))
    if args.budgets is None:
        args.budgets = ",".join(map(str, QUICK_BUDGETS if args.quick else BUDGETS))
    defaults = {**BENCH, **(QUICK if args.quick else {})}
    if any(k == "world.objectives_schedule" and str(v).strip() for k, v in overrides):
        defaults.pop("world.objectives_mix")  # a schedule sets GRPO's counts step by step instead of the mix
    overrides = [(k, str(v)) for k, v in defaults.items()] + list(overrides)  # the command line wins
    return args, overrides


def release_memory() -> None:
    """Drop what the finished workflow left (its models, samplers and compiled programs; the
    persistent compilation cache keeps the programs on disk). Four workflows' worth held at once
    got the run killed for memory on a shared 2-core machine."""
    gc.collect()
    jax.clear_caches()
    gc.collect()


def settings_of(base: Settings, args) -> dict:
    """What every phase's result depends on: a rerun into the same --out must have the same. Each
    workflow's own config is recorded too (every workflow, since a rerun may add some): what
    workflow_config derives from the base (turns, context room, the warm start's objective mix)
    changes with the code, and a warm start or checkpoint made under other rules must not be reused."""
    return json.loads(json.dumps({
        "config": config_record(base), "train_objectives": args.train_objectives,
        "budget_training": args.budget_training,
        "workflow_configs": {w: config_record(workflow_config(base, w, w, args.train_objectives)) for w in WORKFLOWS}}))


def check_settings(out: str, settings: dict) -> None:
    """Write OUT/settings.json on the first run; refuse a rerun whose settings differ (its phases
    would mix two experiments), naming the first difference, before anything trains."""
    path = os.path.join(out, "settings.json")
    if not os.path.exists(path):
        if os.path.isdir(out) and os.listdir(out):  # someone else's files, or a run from before settings.json
            raise UserInputError(f"--out {out} is not empty and holds no settings.json: these tables would reuse or "
                                 "mix with what is there; choose an empty or new --out")
        os.makedirs(out, exist_ok=True)
        write_json(path, settings, indent=1)  # a kill mid-write leaves no half file for the rerun to fail on
        return
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except ValueError as e:  # not JSON (or not UTF-8): not a file this script wrote whole
        raise UserInputError(f"--out {out}: {path} cannot be read ({type(e).__name__}: {e}); it records the "
                             "settings of the run there: restore it, or choose another --out") from None
    diff = first_difference(saved, settings)
    if diff is not None:
        raise UserInputError(f"--out {out} holds a run with other settings ({diff}); its finished phases would be "
                             "mixed into these tables: rerun with the command it was started with "
                             "(docs/paper_tables.md), or choose another --out")


def first_difference(a, b, where: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{where}{k}: {'absent' if k not in a else a[k]!r} -> {'absent' if k not in b else b[k]!r}"
            d = first_difference(a[k], b[k], f"{where}{k}.")
            if d is not None:
                return d
        return None
    return None if a == b else f"{where.rstrip('.')}: {a!r} -> {b!r}"


def provenance(base: Settings, argv, seed: int) -> dict:
    """What a results.json must say about where it came from: the seed, the base model, the git
    commit (and whether the tree had uncommitted changes) and the command."""
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=here, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"seed": seed, "base": os.path.basename(os.path.normpath(str(base.model.source))),
            "git_commit": git("rev-parse", "HEAD") or "unknown", "git_dirty": bool(git("status", "--porcelain")),
            "command": "python bench/paper_tables.py " + " ".join(argv)}


def counts_arg(text: str, flag: str, empty_ok: bool = False) -> tuple[int, ...]:
    """'1,2,8' -> (1, 2, 8); UserInputError naming `flag` unless comma-separated whole numbers >= 1."""
    try:
        counts = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        counts = ()
    if (not counts and not empty_ok) or any(n < 1 for n in counts) or (text.strip() and not counts):
        raise UserInputError(f"{flag} {text!r}: expected comma-separated whole numbers >= 1 (e.g. 1,2,8)")
    return counts


def cli() -> int:
    """main() as a command: bad input is one line on stderr and exit 2, not a traceback."""
    try:
        return main()
    except UserInputError as e:
        print(f"paper_tables: {e}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, overrides = parse_args(argv)
    root = os.path.abspath(args.out)
    if not os.path.isdir(existing_parent(root)):  # before any config is built: a message, not a traceback
        print(f"paper_tables: --out {args.out}: {existing_parent(root)} is a file, not a directory; give a new or "
              "empty directory (or this bench's earlier --out)", file=sys.stderr)
        return 2
    try:
        seeds = tuple(int(x) for x in args.seeds.split(",") if x.strip())
    except ValueError:
        seeds = ()
    if not seeds or min(seeds) < 0:
        raise UserInputError(f"--seeds {args.seeds!r}: expected comma-separated whole numbers >= 0 (e.g. 0,1,2)")
    reports = {}
    for seed in seeds:
        # The bench's settings, built once (the config file's keys refused as a job refuses them).
        base = settings_of_config(load_config(args.config, overrides)).with_values(
            {"world.seed": seed, "train.seed": seed})
        # One seed: OUT itself (as before seeds existed); several: OUT/seed<S>/ each.
        out = os.path.abspath(args.out) if len(seeds) == 1 else os.path.join(os.path.abspath(args.out), f"seed{seed}")
        reports[seed] = run_seed(base, args, argv, seed, out)
    if len(seeds) > 1:
        combined = {"seeds": seeds, "by_seed": reports, **provenance(base, argv, seeds[0])}
        combined.pop("seed")
        write_json(os.path.join(os.path.abspath(args.out), "results.json"), combined, indent=1)
        mean = seed_mean_report(reports)
        text = "\n".join([seeds_table1(reports), "", "The papers' claims on the mean over these seeds "
                          "(bench/paper_targets.py):", "", *target_lines(mean, table2_objectives(mean))])
        write_text(os.path.join(os.path.abspath(args.out), "table1_seeds.md"), text + "\n")
        print("\n" + text, flush=True)
    return 0


def seeds_table1(reports: dict) -> str:
    """Table 1's EM columns over seeds: mean and spread (min-max) per workflow and model."""
    seeds = sorted(reports)
    first = reports[seeds[0]]
    n = first["train_objectives"]
    lines = [f"Seeds {', '.join(map(str, seeds))}: mean (min-max) of held-out EM per objective.", "",
             f"| workflow | model | EM @1 | EM @2 | EM @{n} |" if n != 2 else "| workflow | model | EM @1 | EM @2 |",
             "|---|---|---:|---:|" + ("---:|" if n != 2 else "")]
    cols = (1, 2) if n == 2 else (1, 2, n)
    for w in first["workflows"]:
        for label, key in (("GRPO", "grpo"), ("RFT (same rollouts)", "rft"), ("warm start only", "warm_start")):
            cells = []
            for k in cols:
                vals = [_get(reports[s]["workflows"].get(w, {}), key, k, "em") for s in seeds]
                vals = [100 * v for v in vals if v is not None]
                cells.append(f"{statistics.mean(vals):.1f} ({min(vals):.1f}-{max(vals):.1f})" if vals else "—")
            if any(c != "—" for c in cells):
                lines.append(f"| {w} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pooled_by_turn(rows_by_seed: list[list[dict]]) -> list[dict]:
    """Prompt tokens by turn over seeds: each turn's mean weighted by its episodes, the max of the
    maxima, the episodes summed (the same rows as one evaluation of all the seeds' episodes)."""
    turns = {}
    for rows in rows_by_seed:
        for r in rows:
            t = turns.setdefault(r["turn"], {"turn": r["turn"], "sum": 0.0, "max": 0, "n": 0})
            t["sum"] += r["mean"] * r["n"]
            t["max"] = max(t["max"], r["max"])
            t["n"] += r["n"]
    return [{"turn": t["turn"], "mean": t["sum"] / t["n"] if t["n"] else 0.0, "max": t["max"], "n": t["n"]}
            for _, t in sorted(turns.items())]


def _over_seeds(key: str, values: list):
    """A figure over seeds: the largest of a maximum (peak_tokens_max), else the mean."""
    return max(values) if key.endswith("_max") else statistics.mean(values)


def seed_mean_report(reports: dict) -> dict:
    """One report whose every figure is the mean over the seeds that have it: per workflow, model
    and objective count, each scalar that every seed measured (a phase one seed lacks is left out,
    so a claim reads the seeds' common ground; a maximum is the largest); prompt tokens by turn
    pooled; a memory budget from the seeds that ran it. What bench/paper_targets.py checks for the seeds together."""
    seeds = sorted(reports)
    first = reports[seeds[0]]
    out = {k: first.get(k) for k in ("train_objectives", "objectives", "eval_questions")}
    out["workflows"] = {}
    for w in first["workflows"]:
        runs = [reports[s]["workflows"].get(w) for s in seeds]
        if any(r is None for r in runs):
            continue
        res = {}
        for key in ("grpo_minutes", "job_minutes"):
            if all(key in r for r in runs):
                res[key] = statistics.mean(r[key] for r in runs)
        for model in ("warm_start", "grpo", "rft"):
            by_n = [{int(n): m for n, m in (r.get(model) or {}).items()} for r in runs]
            common = set.intersection(*(set(b) for b in by_n))
            cells = {}
            for n in sorted(common):
                ms = [b[n] for b in by_n]
                cell = {k: _over_seeds(k, [m[k] for m in ms]) for k in SCALARS + COVERAGE
                        if all(m.get(k) is not None for m in ms)}
                if all("prompt_tokens_by_turn" in m for m in ms):
                    cell["prompt_tokens_by_turn"] = _pooled_by_turn([m["prompt_tokens_by_turn"] for m in ms])
                cells[n] = cell
            if cells:
                res[model] = cells
        out["workflows"][w] = res
    budgets = {}
    for s in seeds:
        for b, m in (reports[s].get("budgets") or {}).items():
            budgets.setdefault(int(b), []).append(m)
    out["budgets"] = {b: {k: _over_seeds(k, [m[k] for m in ms]) for k in SCALARS
                          if all(m.get(k) is not None for m in ms)} for b, ms in budgets.items()}
    return out


def run_seed(base: Settings, args, argv, seed: int, out: str) -> dict:
    """Every table for one seed, into `out` (resumable: see the module docstring)."""
    workflows = [w for w in args.workflows.split(",") if w]
    unknown = [w for w in workflows if w not in workflow_names()]
    if unknown or not workflows:
        raise TrainConfigError(f"--workflows {args.workflows!r}: expected some of {', '.join(workflow_names())}, "
                             f"comma-separated{f'; {unknown[0]!r} is none of them' if unknown else ''}")
    objectives = counts_arg(args.objectives, "--objectives")
    budgets = counts_arg(args.budgets, "--budgets", empty_ok=True)
    if args.train_objectives < 1:
        raise UserInputError(f"--train-objectives {args.train_objectives}: expected a whole number >= 1")
    eval_q = args.eval_questions or (QUICK_EVAL_QUESTIONS if args.quick else base.train.eval_questions)
    cfgs = {w: workflow_config(base, w, os.path.join(out, w), args.train_objectives) for w in workflows}
    for cfg in cfgs.values():  # every workflow's config is checked before anything trains
        validate(cfg)
        for n in objectives:
            validate(eval_config(cfg, n), training=False)
    check_settings(out, {**settings_of(base, args), "eval_questions": eval_q})
    report = {"date": time.strftime("%Y-%m-%d"), **provenance(base, argv, seed),
              "train_objectives": args.train_objectives, "train_mix": str(base.world.objectives_mix),
              "objectives": list(objectives), "eval_questions": eval_q,
              "quick": args.quick, "budget_training": args.budget_training, "workflows": {}, "budgets": {},
              "reading_probe": reading_limit(base.model.source)}
    t0 = time.perf_counter()
    for w, cfg in cfgs.items():
        print(f"=== {w}: warm start, GRPO, evaluation", flush=True)
        report["workflows"][w] = run_workflow(cfg, objectives, out, ModelEvaluator(cfg, eval_q), rft=not args.no_rft)
        write_report(report, out)
        release_memory()  # the next workflow's programs and models: one workflow's at a time in memory
    if budgets and ("memsearcher" in cfgs or args.budget_training):
        print("=== memsearcher memory budgets", flush=True)
        cfg = cfgs.get("memsearcher") or workflow_config(base, "memsearcher", os.path.join(out, "memsearcher"),
                                                          args.train_objectives)
        report["budgets"] = budget_sweep(cfg, budgets, out, eval_q, args.budget_training)
    write_report(report, out)
    print("\n" + tables_markdown(report), flush=True)
    print(f"this command's wall time: {(time.perf_counter() - t0) / 60:.1f} min (phases done earlier skipped)",
          flush=True)
    return report


def write_report(report: dict, out: str) -> None:
    """results.json, tables.md and the by-turn PNG (rewritten after every workflow)."""
    # Every file rewritten whole through run_dir.replaced: a link in OUT is replaced, never written through.
    write_json(os.path.join(out, "results.json"), report, indent=1)
    write_text(os.path.join(out, "tables.md"), tables_markdown(report))
    n = table2_objectives(report)
    by_turn = {w: _get(r, "grpo", n, "prompt_tokens_by_turn") or [] for w, r in report["workflows"].items()}
    if any(by_turn.values()):  # no rows, no plot (and no empty file)
        with replaced(os.path.join(out, "prompt_tokens_by_turn.png")) as tmp:
            plot_prompt_tokens_by_turn(by_turn, tmp, title=f"prompt tokens per act call by turn ({n} objectives)")


if __name__ == "__main__":
    sys.exit(cli())
