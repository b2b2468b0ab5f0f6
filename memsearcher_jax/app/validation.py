"""What a config cannot tell alone, asked before any work; every message names the key and what was expected.

    out = check_training(cfg, fresh)    # the one pass over a training run: config_rules.check_config
                                        # (every rule of the config: its values, settings, the files
                                        # it names, the cache; then the plan), the output directory
                                        # (check_writable), a resumed run's record, the retriever
    check_setup(cfg, setup)             # against the built set-up: the model's tokenizer, the
                                        # episodes (episode_problems): what the config cannot tell
Both run before any model is loaded, any warm start runs or the output directory is made.
Evaluation asks config_rules.check_config(cfg, training=False) and check_retriever, then
check_setup(..., training=False); the command line asks check_writable of `eval --out` and
`export-hf --out`. Every rule of the config itself lives in config_rules.py.
"""
from __future__ import annotations

import dataclasses
import os

from memsearcher_jax.agent.config import AgentConfig, episode_turns
from memsearcher_jax.agent.trajectory import Trajectory
from memsearcher_jax.agent.workflows import get_workflow
from memsearcher_jax.app.experiment import Setup, demo_questions, eval_questions
from memsearcher_jax.data.synthetic import objectives_of
from memsearcher_jax.rules.config_rules import TrainConfigError, agent_config, check_config, refuse
from memsearcher_jax.rules.run_dir import check_output_dir, check_same_experiment, existing_parent, output_dir_path
from memsearcher_jax.settings import RetrievalSettings, Settings

# The first prompt grows with the question's length alone: the longest few questions bound it.
LONGEST_QUESTIONS = 8


def first_prompt_tokens(setup: Setup, agent: AgentConfig, question: str) -> int:
    """Tokens of the first act call's context for `question`, built by the workflow as the turn
    loop builds it (AgentRunner._run: start, then open_turn of turn 0)."""
    wf = get_workflow(agent.workflow)
    t = Trajectory(traj_id=0, group_id=0, question=question, golds=[])
    wf.start(t, setup.builder, agent)
    wf.open_turn(t, 0, setup.builder, agent)
    return len(t.final.prompt_ids) + len(t.final.response_ids)


def prompt_problems(cfg: Settings, setup: Setup, agent: AgentConfig,
                    questions: list[dict]) -> list[str]:
    """The first prompt of every question must leave room for a whole act (min of
    agent.max_new_tokens and agent.max_response_tokens) within agent.max_context_tokens: a longer
    one gets a 1-token response (or none) on every turn and trains on nothing."""
    longest = sorted(questions, key=lambda q: len(q["question"]), reverse=True)[:LONGEST_QUESTIONS]
    if not longest:
        return []
    worst = max(first_prompt_tokens(setup, agent, q["question"]) for q in longest)
    room = min(agent.max_new_tokens, agent.max_response_tokens)
    if worst + room <= agent.max_context_tokens:
        return []
    objectives = f", world.objectives={cfg.world.objectives}" if setup.world is not None else ""
    return [f"agent.max_context_tokens={agent.max_context_tokens}: the longest question's first prompt is {worst} "
            f"tokens ({agent.workflow} workflow{objectives}), and a response needs up to {room} more "
            "(agent.max_new_tokens, agent.max_response_tokens); raise agent.max_context_tokens to >= "
            f"{worst + room}" + (" or lower world.objectives" if objectives and cfg.world.objectives > 1 else "")]


def demo_turn_problems(rows: list[dict], max_turns: int, objectives: int, per_question: int = 0) -> list[str]:
    """The warm start's demonstrator searches each hop of each objective of its questions (`rows`)
    in its own turn, then answers: a question of n objectives needs up to 2n + 1 turns, and it has
    max(4, agent.max_turns) (`max_turns`; `objectives`: world.objectives, for the message), plus
    agent.turns_per_question (`per_question`) for each objective after the first."""
    needs = [(sum(int(o["hops"]) for o in objectives_of(r)) + 1, len(objectives_of(r))) for r in rows]
    short = [need for need, n in needs if need > episode_turns(max(4, max_turns), per_question, n)]
    if not short:
        return []
    need = max(short)
    if per_question:
        return [f"agent.max_turns={max_turns}, agent.turns_per_question={per_question}: the warm start's "
                f"demonstrations need up to {need} turns (one search per hop of each objective, then the answer) "
                "at a count their budget does not cover; raise either, or set sft.steps=0"]
    return [f"agent.max_turns={max_turns}: the warm start's demonstrations of world.objectives="
            f"{objectives} questions need up to {need} turns (one search per hop of each objective, then "
            f"the answer); raise agent.max_turns to >= {need}, lower world.objectives, or set sft.steps=0"]


def demo_retrieval_problems(cfg: Settings, setup: Setup, rows: list[dict],
                            probes: int = 4) -> list[str]:
    """The warm start's demonstrator searches the world's queries and records the facts they find:
    a retriever serving another corpus finds none ("did not retrieve the hop-1 fact", a traceback
    after the warm start began). A few of its first searches (of its questions, `rows`), tried now, tell."""
    rows = [o for r in rows[:probes] for o in objectives_of(r)][:probes]
    queries = [o["queries"][0] for o in rows]
    found = setup.retriever.search(queries, cfg.agent.default_top_n) if queries else []
    missed = [(q, o["facts"][0]) for q, o, hits in zip(queries, rows, found)
              if o["facts"][0] not in " ".join(h.contents for h in hits[:cfg.agent.default_top_n])]
    if not missed:
        return []
    where = {"http": f"retrieval.url={cfg.retrieval.url}", "index": f"retrieval.index_dir={cfg.retrieval.index_dir}"}
    served = where.get(cfg.retrieval.kind, f"retrieval.kind={cfg.retrieval.kind}")
    return [f"{served}: the retriever does not serve the synthetic world's passages ({len(missed)} of {len(queries)} "
            f"of the warm start's first searches missed their fact, e.g. {missed[0][0]!r} did not return "
            f"{missed[0][1]!r}); the warm start's demonstrations need the world's corpus ({setup.world.corpus}): "
            "index and serve that, use retrieval.kind=bm25, or set sft.steps=0"]


def check_same_tokenizer(model_dir: str, setup: Setup, key: str = "--model") -> None:
    """A synthetic-world job (evaluation of --model, training from model.source: `key`) must read
    with the model's own tokenizer: a model directory without its base's reading_vocab.json makes
    the world build another vocabulary (and another world)."""
    mine, used = os.path.join(model_dir, "tokenizer.json"), os.path.join(setup.tokenizer_dir, "tokenizer.json")
    if setup.world is None or not os.path.isfile(mine) or os.path.abspath(mine) == os.path.abspath(used):
        return
    with open(mine, "rb") as a, open(used, "rb") as b:
        if a.read() == b.read():
            return
    named = f"{key} {model_dir}" if key.startswith("--") else f"{key}={model_dir}"
    raise TrainConfigError(f"{named}: its tokenizer.json differs from the synthetic world's "
                           f"({used}), so its answers would be read with another vocabulary. "
                           + ("" if os.path.isfile(os.path.join(model_dir, "reading_vocab.json")) else
                              f"{model_dir} has no reading_vocab.json: copy it from the base the model was "
                              "trained from (memsearcher_jax/bases/...), or ") +
                           "set world.* to the world the model was trained on")


def episode_problems(cfg: Settings, setup: Setup, training: bool = True,
                     workflow: str | None = None) -> list[str]:
    """Whether the episodes the job will run can run: training (its rollouts, its held-out
    evaluations and its warm start's demonstrations) or evaluation (workflow: --workflow)."""
    agent = agent_config(cfg)
    if training:
        questions = setup.train_questions + eval_questions(cfg.train, setup)
        # The questions the warm start's demonstrator scripts (none when it does not run).
        demos = demo_questions(cfg, setup) if cfg.sft.steps > 0 and setup.world is not None else []
        return (prompt_problems(cfg, setup, agent, questions)
                + demo_turn_problems(demos, cfg.agent.max_turns, cfg.world.objectives, agent.turns_per_question)
                + demo_retrieval_problems(cfg, setup, demos))
    agent = agent.evaluation(cfg.agent.eval_max_turns)
    if workflow:
        agent = dataclasses.replace(agent, workflow=workflow)
    return prompt_problems(cfg, setup, agent, setup.train_questions + setup.eval_questions)


def check_retriever(retrieval: RetrievalSettings) -> None:
    """retrieval.kind=http: the server answers a probe search (before any world or model is built)."""
    if retrieval.kind == "http":
        from retrieval.client import HTTPRetriever

        with HTTPRetriever(retrieval.url, api=retrieval.api) as retriever:
            retriever.check_reachable()


def check_writable(path: str, named: str) -> None:
    """UserInputError naming `named` unless the job can make and write the output directory `path`
    (a remote one is not asked): a PermissionError when the first file was written was a traceback,
    and for `eval --out` it came after the whole evaluation, its results lost."""
    if not path or "://" in path:
        return
    parent = existing_parent(os.path.abspath(os.path.expanduser(path)))
    # A file there, or above it: the output checks' own refusal (check_output_dir, check_eval_out, ...).
    if os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
        raise TrainConfigError(f"{named}: {parent} is not writable; give a directory this process can write")


def check_training(cfg: Settings, fresh: bool = False) -> str:
    """Every check a training run can make before it builds anything, in order: the config
    (config_rules.check_config), its output directory (blank, a file, a directory of the user's, one in use;
    with `fresh`, one holding files no run wrote), resuming, the experiment recorded there
    (run_dir.check_same_experiment), and last, after every local check, the retriever's probe
    (check_retriever). Returns the output directory, absolute (a remote one as it is)."""
    check_config(cfg)
    out = output_dir_path(cfg.train.output_dir)
    check_output_dir(out, fresh=fresh)
    check_writable(out, f"train.output_dir={cfg.train.output_dir}")
    if not fresh:
        check_same_experiment(cfg, out)
    check_retriever(cfg.retrieval)
    return out


def check_setup(cfg: Settings, setup: Setup, training: bool = True, workflow: str | None = None,
                model_dir: str | None = None) -> None:
    """What the config alone cannot tell, asked of the built set-up before any model is loaded: the
    model reads with the set-up's tokenizer (model_dir: eval's --model; training: model.source),
    and the job's episodes fit (episode_problems; workflow: eval's --workflow)."""
    if model_dir:
        check_same_tokenizer(model_dir, setup)
    elif training and cfg.model.source != "init":
        check_same_tokenizer(os.path.expanduser(cfg.model.source), setup, key="model.source")
    problems = episode_problems(cfg, setup, training, workflow)
    refuse(problems, "training config" if training else "evaluation config")
