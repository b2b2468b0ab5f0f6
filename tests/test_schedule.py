"""Issue 83 item 2: a schedule of GRPO's question counts (world.objectives_schedule, by step and by a
training-EM threshold, resumed exactly across a stage boundary) and a turn budget per count
(agent.turns_per_question)."""
from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from memsearcher_jax.agent.config import AgentConfig, episode_turns
from memsearcher_jax.data.synthetic import join_objectives, mix_objectives, parse_objectives_schedule
from memsearcher_jax.rl.schedule import QuestionSchedule, batch_for_step

ROWS = [{"id": f"r{i}", "question": f"What is q{i}?", "golden_answers": [f"a{i}"], "subject": f"S{i}", "hops": 1}
        for i in range(40)]


def _count(q: dict) -> int:
    return len(q.get("objectives", [q]))


def _schedule(spec: str, **kw) -> QuestionSchedule:
    stages = parse_objectives_schedule(spec)
    return QuestionSchedule(pools=tuple(mix_objectives(ROWS, c, seed=0) for _, c in stages),
                            starts=tuple(s for s, _ in stages), counts=tuple(c for _, c in stages), **kw)


def _cfg(**world):
    from memsearcher_jax.settings import load_settings

    return load_settings("configs/default.py").with_values({f"world.{k}": v for k, v in world.items()})


# ----------------------------------------------------------------------------- syntax and config rules

def test_the_schedule_parses_stages_and_refuses_anything_else_naming_the_key():
    assert parse_objectives_schedule("") == ()
    assert parse_objectives_schedule(" 0:1,2;20:2,4;40:4,8 ") == ((0, (1, 2)), (20, (2, 4)), (40, (4, 8)))
    assert parse_objectives_schedule("0:3") == ((0, (3,)),)
    for bad in ("1:1,2", "0:1;0:2", "0:1;5:2;3:4", "0:0,1", "0:1,x", "0-1", "0:1;", "a:1"):
        with pytest.raises(ValueError, match=r"world\.objectives_schedule=.*STEP:COUNTS"):
            parse_objectives_schedule(bad)


@pytest.mark.parametrize("world, agent, message", [
    ({"objectives_schedule": "5:1"}, {}, r"world\.objectives_schedule='5:1': expected stages"),
    ({"objectives_schedule": "0:1;9:2", "objectives_mix": "1,2"}, {}, r"set world\.objectives_mix=''"),
    ({"schedule_advance_em": 0.5}, {}, r"world\.schedule_advance_em=0\.5 ends a stage .* set a schedule"),
    ({"objectives_schedule": "0:1;9:2", "schedule_advance_em": 1.5}, {}, r"world\.schedule_advance_em=1\.5: a "),
    ({"objectives_schedule": "0:1;9:2", "schedule_window": 0}, {}, r"world\.schedule_window=0"),
    ({"objectives_schedule": "0:1;9:2", "enabled": False}, {}, r"world\.objectives_schedule='0:1;9:2' joins"),
    ({}, {"hint": "always"}, r"agent\.hint='always': expected one of 'none', 'turns', 'turns_and_questions'"),
    ({}, {"turns_per_question": -1}, r"turns_per_question must be >= 0"),
])
def test_config_rules_name_the_key(world, agent, message):
    from memsearcher_jax.app.experiment import TrainConfigError, validate

    cfg = _cfg(**world).with_values({f"agent.{k}": v for k, v in agent.items()})
    with pytest.raises(TrainConfigError, match=message):
        validate(cfg)


def test_the_schedule_counts_are_the_training_counts():
    from memsearcher_jax.rules.config_rules import multi_answer_prompt, train_objective_counts

    cfg = _cfg(objectives_schedule="0:1;10:2,4;20:8")
    assert train_objective_counts(cfg) == (1, 2, 4, 8)   # the set-up's questions and the demos' default
    assert multi_answer_prompt(cfg)                       # auto: the prompts state the N-answer format
    assert train_objective_counts(_cfg()) == (1,)


# ----------------------------------------------------------------------------- counts and turn budgets per step

def test_the_counts_and_turn_budgets_of_each_step():
    sched = _schedule("0:1,2;3:2,4;6:4,8")
    agent = AgentConfig(max_turns=4, turns_per_question=2)
    want = {0: {1, 2}, 1: {1, 2}, 2: {1, 2}, 3: {2, 4}, 4: {2, 4}, 5: {2, 4}, 6: {4, 8}, 7: {4, 8}, 8: {4, 8}}
    for step in range(9):
        batch, _ = batch_for_step(sched.questions, step, 16, seed=0)
        counts = [_count(q) for q in batch]
        assert set(counts) == want[step], step
        # Equal shares: the stage's pool interleaves its counts one row at a time.
        assert sorted(_count(q) for q in sched.questions) == sorted(list(want[step]) * len(ROWS))
        # A turn budget per count: 2N + 2 (a search per hop of a 2-hop question, the answer, a spare).
        assert [agent.episode_turns(n) for n in counts] == [2 * n + 2 for n in counts]
        logged = sched.observe(step + 1, em=0.0)
        assert logged == {"schedule_stage": step // 3, "schedule_questions_max": max(want[step])}
    # Off: max_turns at every count, as before; the evaluation's budget grows from its own base.
    assert [AgentConfig(max_turns=4).episode_turns(n) for n in (1, 2, 8)] == [4, 4, 4]
    assert agent.evaluation(6).episode_turns(8) == 6 + 2 * 7
    assert episode_turns(5, 3, 0) == 5  # a question count below one is one question


def test_the_bench_and_the_library_give_the_same_turn_rule():
    sys.path.insert(0, ".")
    from bench.paper_tables import turns_for

    assert all(turns_for(n) == AgentConfig(max_turns=4, turns_per_question=2).episode_turns(n) for n in range(1, 17))


def test_no_schedule_changes_nothing():
    sched = QuestionSchedule.fixed(ROWS)
    assert not sched.active and sched.questions is ROWS and sched.state() == {}
    assert sched.observe(1, em=1.0) == {} and sched.stage == 0
    sched.restore({"step": 50, "schedule_stage": 3})
    assert sched.stage == 0


def test_a_success_threshold_ends_a_stage_early_and_the_start_steps_stay_deadlines():
    # Window 2, threshold 0.5; the start steps 0, 8, 9 are the latest each stage may begin.
    sched = _schedule("0:1;8:2;9:4", advance_em=0.5, window=2)
    ems = [0.4, 0.6, 0.2, 0.3, 0.4, 0.5, 0.4, 0.1, 0.1, 0.1]
    stages = []
    for step, em in enumerate(ems):
        stages.append(sched.stage)
        sched.observe(step + 1, em)
    # Steps 0-1 in stage 0 (their mean 0.5 reaches 0.5); stage 1 (from step 2, not 8) starts a new window
    # whose means (0.25, 0.35, 0.45, 0.45, 0.25, 0.1) stay below; step 9 is stage 2's deadline.
    assert stages == [0, 0, 1, 1, 1, 1, 1, 1, 1, 2]
    assert sched.recent == [0.1]  # the window restarted at stage 2 (step 9 alone)


# ----------------------------------------------------------------------------- resume

def _run(sched: QuestionSchedule, ems, first_step=0):
    stages = []
    for k, em in enumerate(ems):
        stages.append(sched.stage)
        sched.observe(first_step + k + 1, em)
    return stages


def test_a_resumed_schedule_continues_exactly_across_a_stage_boundary():
    ems = [0.1, 0.2, 0.9, 0.8, 0.1, 0.9, 0.9, 0.3]
    whole = _run(_schedule("0:1;100:2;200:4", advance_em=0.6, window=3), ems)
    assert whole == [0, 0, 0, 0, 1, 1, 1, 2]  # (0.2, 0.9, 0.8) -> stage 1 at step 4; (0.1, 0.9, 0.9) -> 2 at 7
    for cut in range(1, len(ems)):
        first = _schedule("0:1;100:2;200:4", advance_em=0.6, window=3)
        before = _run(first, ems[:cut])
        meta = json.loads(json.dumps({"step": cut, **first.state()}))  # as a checkpoint's metadata keeps it
        again = _schedule("0:1;100:2;200:4", advance_em=0.6, window=3)
        again.restore(meta)
        assert before + _run(again, ems[cut:], first_step=cut) == whole, cut
    # Without the kept window, a resume after step 3 would stay in stage 0 at step 4.
    lost = _schedule("0:1;100:2;200:4", advance_em=0.6, window=3)
    lost.restore({"step": 3, "schedule_stage": 0})
    assert _run(lost, ems[3:], first_step=3) != whole[3:]
    # A checkpoint written before the schedule was set resumes at the stage its step gives.
    old = _schedule("0:1;4:2;6:4")
    old.restore({"step": 5})
    assert old.stage == 1


class _CountingRunner:
    """The Trainer's view of a turn loop (as tests/test_train_step.py's): one short conversation per
    trajectory; records the question count of every question it is asked, step by step."""

    def __init__(self):
        from tests.test_train_step import _FixedRewardRunner

        self.inner, self.asked = _FixedRewardRunner(lambda g: float(g)), []
        self.sampler, self.stats = self.inner.sampler, self.inner.stats

    def run(self, questions, **kw):
        self.asked.append([_count(q) for q in questions])
        return self.inner.run(questions, **kw)


def _em_is_one(blocks, ended_with_eos, golds):
    from memsearcher_jax.qa_metrics import RewardResult

    return RewardResult(reward=float(golds[0]), em=1.0, f1=0.0, format_ok=True, answer=None)


def _trainer(out, steps):
    from flax import nnx

    from memsearcher_jax.models import ModelConfig, Qwen2
    from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig
    from memsearcher_jax.rl.trainer import LoopConfig, Trainer

    learner = GRPOLearner(Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(0)),
                          GRPOConfig(optimizer_steps=1, micro_batch_size=4, logprob_batch_size=4, min_seq_len=16,
                                     optim=OptimConfig(learning_rate=1e-3)))
    loop = LoopConfig(steps=steps, batch_questions=2, group_size=2, seed=0, output_dir=str(out), save_every=3)
    # Stages by threshold only (their start steps are far off): the window kept in the checkpoint decides.
    sched = _schedule("0:1;100:2;200:3", advance_em=0.5, window=2)
    return Trainer(learner, _CountingRunner(), ROWS, pad_id=0, loop=loop, progress=False, reward_fn=_em_is_one,
                   schedule=sched)


@pytest.mark.slow
def test_a_trainer_resumed_mid_window_asks_the_same_questions(tmp_path):
    # EM 1 every step, window 2: an uninterrupted run is in stage 0 for steps 0-1, stage 1 for 2-3 and
    # stage 2 from step 4, asking 1, 2 and 3 questions at once. Stopped after step 3 (stage 1, one EM
    # in its window; the checkpoint of step 3 keeps both), the resumed run goes on exactly so.
    first = _trainer(tmp_path, 3)
    history = first.train()
    first.close()
    assert [m["schedule_stage"] for m in history] == [0, 0, 1]
    resumed = _trainer(tmp_path, 6)
    rest = resumed.train()
    resumed.close()
    assert [m["schedule_stage"] for m in rest] == [1, 2, 2]
    assert [a[0] for a in first.runner.asked + resumed.runner.asked] == [1, 1, 2, 2, 3, 3]
    assert all(len(set(a)) == 1 and len(a) == 2 for a in first.runner.asked + resumed.runner.asked)


# ----------------------------------------------------------------------------- from the config

def test_the_trainer_gets_one_pool_per_stage_from_the_world(tmp_path):
    from memsearcher_jax.app.experiment import question_schedule
    from memsearcher_jax.data.world_cache import prepare_world
    from memsearcher_jax.runtime.jsonl import read_jsonl

    world = prepare_world(str(tmp_path), seed=1, num_entities=30)
    setup = types.SimpleNamespace(world=world)
    assert question_schedule(_cfg().world, setup) is None
    sched = question_schedule(_cfg(objectives_schedule="0:1,2;5:4", schedule_advance_em=0.7, schedule_window=3).world,
                              setup)
    train = read_jsonl(world.train)
    assert sched.starts == (0, 5) and sched.counts == ((1, 2), (4,)) and (sched.advance_em, sched.window) == (0.7, 3)
    assert sched.pools[1] == join_objectives(train, 4, seed=0)
    assert [_count(q) for q in sched.pools[0][:6]] == [1, 2, 1, 2, 1, 2]


def test_demonstrations_fit_a_budget_per_count():
    from memsearcher_jax.app.validation import demo_turn_problems

    rows = [{"objectives": [{"hops": 2}] * n} for n in (1, 2, 4)]  # need 3, 5 and 9 turns
    assert demo_turn_problems(rows, 4, 1, per_question=2) == []    # budgets 4, 6, 10
    problems = demo_turn_problems(rows, 4, 1, per_question=1)      # budgets 4, 5, 7
    assert len(problems) == 1 and "agent.turns_per_question=1" in problems[0] and "up to 9 turns" in problems[0]
    assert "raise agent.max_turns to >= 9" in demo_turn_problems(rows, 4, 4)[0]  # off: as before
    assert np.array_equal([episode_turns(4, 2, n) for n in (1, 2, 4)], [4, 6, 10])


def test_the_bench_passes_the_schedule_budgets_hint_and_weighting_through():
    sys.path.insert(0, ".")
    import bench.paper_tables as pt
    from memsearcher_jax.app.experiment import validate
    from memsearcher_jax.rules.config_rules import agent_config, grpo_config
    from memsearcher_jax.settings import load_settings

    args, overrides = pt.parse_args(["--config.world.objectives_schedule=0:1,2;20:2,4;40:4,8",
                                     "--config.agent.turns_per_question=2", "--config.agent.hint=turns_and_questions",
                                     "--config.rl.aggregation=trajectory_row_mean"])
    base = load_settings("configs/default.py", overrides)
    assert base.world.objectives_mix == ""  # the bench's 1-4 mix gives way to the schedule
    cfg = pt.workflow_config(base, "memsearcher", "/tmp/x/ms", args.train_objectives)
    validate(cfg)
    agent = agent_config(cfg)
    # max_turns stays one question's (4): 2N + 2 per count, 18 at 8 questions; memory for 8 questions.
    assert agent.max_turns == 4 and [agent.episode_turns(n) for n in (1, 2, 4, 8)] == [4, 6, 10, 18]
    assert cfg.agent.memory_budget == pt.MEMORY_PER_OBJECTIVE * 8 and cfg.agent.hint == "turns_and_questions"
    assert grpo_config(cfg).loss.aggregation == "trajectory_row_mean"
    ev = pt.eval_config(cfg, 16)
    assert ev.agent.eval_max_turns == base.agent.eval_max_turns and agent.evaluation(6).episode_turns(16) == 36
    # Without the per-count budget the bench's own rule stands: max_turns covers the largest count's
    # demonstrations (2 x 8 + 1) at every count.
    _, plain = pt.parse_args(["--config.world.objectives_schedule=0:1,2;20:2,4;40:4,8"])
    assert pt.workflow_config(load_settings("configs/default.py", plain), "react", "/tmp/x/r", 2).agent.max_turns == 17
