"""The per-question information signal (rl/information.py, issue 83 item 1): it scores what the
carried context holds, each design's carried context is the one its next turn's prompt is built
from, and with rl.info_coef 0 a training step is bit-identical to one without it."""
from __future__ import annotations

import random
import types

import jax
import numpy as np
import pytest

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.agent.trajectory import Conversation, Trajectory
from memsearcher_jax.agent.workflows.base import differing_span
from memsearcher_jax.agent.workflows.mem1 import mem1_first_context
from memsearcher_jax.bases import DEFAULT_BASE
from memsearcher_jax.qa_metrics import RewardResult
from memsearcher_jax.rl.information import (
    information_bonus,
    information_metrics,
    information_scores,
    probe_rows,
    probe_tokens,
    shaped_advantages,
)
from memsearcher_jax.sampling.buckets import bucket
from retrieval.base import Hit
from tests.test_demos import _ReplaySampler


@pytest.fixture(scope="module")
def reading():
    """The shipped base's tokenizer (names and values are whole tokens, <memory> a tag) and a world
    on its reserved names (never seen in pretraining): what the default job runs on."""
    from memsearcher_jax.data.synthetic import generate_world
    from memsearcher_jax.data.tokenizer import load_tokenizer
    from memsearcher_jax.data.vocab import ReadingVocab
    from retrieval.bm25 import BM25Retriever

    tok = load_tokenizer(DEFAULT_BASE)
    vocab = ReadingVocab.load(DEFAULT_BASE)
    world = generate_world(7, num_entities=30, heldout_fraction=0.0, names=vocab.pool("reserved"),
                           wording=vocab.wording)
    builder = PromptBuilder(tok, style="compact", default_top_n=2)
    return tok, builder, world, BM25Retriever.from_passages(world.corpus)


@pytest.fixture(scope="module")
def base_learner():
    from memsearcher_jax.models import from_pretrained
    from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner

    return GRPOLearner(from_pretrained(DEFAULT_BASE), GRPOConfig(logprob_batch_size=8, min_seq_len=64))


def _memsearcher_trajectory(b, task, memories):
    """A memsearcher episode as the loop records it: one conversation per turn on question + memory,
    each turn's carried span found as the loop finds it (`Workflow.carried_span`)."""
    question = "; ".join(r["question"] for r in task)
    t = Trajectory(traj_id=0, group_id=0, question=question, golds=[r["golden_answers"] for r in task],
                   objectives=[r["question"] for r in task])
    for k, memory in enumerate(memories):
        t.conversations.append(Conversation(prompt_ids=b.memsearcher_context(question, memory), turn=k))
        t.carried.append((k, *differing_span(t.conversations[0].prompt_ids, t.conversations[k].prompt_ids)))
    return t


def _naive_logp(model, ids, n_gold) -> float:
    """log p(last n_gold tokens | the rest), one unpadded forward pass, log-softmax in float64."""
    logits = np.asarray(model(np.asarray([ids], np.int32))[0], np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return float(sum(logits[j - 1, ids[j]] - logz[j - 1] for j in range(len(ids) - n_gold, len(ids))))


@pytest.mark.parametrize("packed", [True, False])
def test_a_context_holding_the_gold_scores_higher(reading, base_learner, packed):
    """Two-question tasks whose memory first holds neither fact, then the first, then both, then only
    the second (the first lost): the shipped base's log p(gold) rises by more than a nat where the
    memory gains a question's fact and falls where it loses it, on every task. It fails if the
    carried context is not in the probe (nothing moves), if the gold is scored at the wrong
    positions, or if the scores are not the model's (checked against a plain forward pass)."""
    import dataclasses

    from memsearcher_jax.rl.grpo import GRPOLearner

    _, b, world, _ = reading
    learner = base_learner if packed else GRPOLearner(
        base_learner.model(), dataclasses.replace(base_learner.config, pack_rows=False))
    rows = [r for r in world.train if r["hops"] == 1]
    random.Random(1).shuffle(rows)
    tasks = [(rows[2 * i], next(r for r in rows if r["subject"] != rows[2 * i]["subject"]
                                 and r["relation"] != rows[2 * i]["relation"])) for i in range(6)]
    trajs = [_memsearcher_trajectory(b, (q1, q2), ["", q1["facts"][0], f"{q1['facts'][0]} {q2['facts'][0]}",
                                                   q2["facts"][0]]) for q1, q2 in tasks]
    calls = []

    def score_rows(rows_):
        calls.append(rows_.num_rows)
        return learner.compute_logprobs(learner.params, rows_)

    scores = information_scores(score_rows, b, trajs, min_len=64)
    assert len(calls) == 1  # one batched pass for every probe of every trajectory
    for s, (q1, q2) in zip(scores, tasks):
        assert s.shape == (4, 2)
        assert s[1, 0] > s[0, 0] + 1 and s[2, 1] > s[1, 1] + 1, (q1["question"], q2["question"], s)
        assert s[3, 0] < s[2, 0] - 1 and s[3, 1] > s[0, 1] + 1, s  # the first fact lost, the second kept
        assert s[1:3, 0].max() > -0.5  # the fact in memory: the answer read nearly surely
    m = information_metrics(scores)
    assert m["info/lost_share"] == 0.5 and m["info/gain_turn1_mean"] > 1 and m["info/gain_turn3_mean"] < 0
    # The scores are the model's log-probabilities of the gold, teacher-forced after carried + probe.
    model, t, (q1, _) = learner.model(), trajs[0], tasks[0]
    for k in (0, 2):
        ids, n = probe_tokens(b, t.carried_ids(k), q1["question"], q1["golden_answers"][0])
        assert b.decode(ids).endswith(f"</question>\n\\boxed{{{q1['golden_answers'][0]}")
        assert scores[0][k, 0] == pytest.approx(_naive_logp(model, ids, n), abs=2e-4)


def test_probe_rows_mask_the_gold_and_a_long_context_keeps_its_newest_tokens(reading):
    _, b, _, _ = reading
    carried = b.encode_plain(" ".join(f"fact {i}." for i in range(200)))
    ids, n = probe_tokens(b, carried, "What year was Bolin born?", "1950", max_len=120)
    assert len(ids) == 120 and ids[-n:] == b.encode_plain("1950")
    full, _ = probe_tokens(b, carried, "What year was Bolin born?", "1950")
    assert full[len(full) - 120:] == ids and full[:len(carried)] == carried  # only the oldest tokens dropped
    rows = probe_rows([ids, full], [n, n], b.pad_id, min_len=64)
    assert rows.tokens.shape[1] == bucket(len(full), 64) and rows.loss_mask.sum(axis=1).tolist() == [n, n]
    assert rows.tokens[0, 120 - n:120].tolist() == ids[-n:] and rows.loss_mask[0, 120 - n:120].all()
    assert rows.tokens[1, :len(full)].tolist() == full and not rows.attention[1, len(full):].any()


def test_information_metrics_by_hand():
    s1 = np.array([[-5.0, -4.0], [-1.0, -4.0], [-3.0, -0.5]])   # q1 rises then falls 2 nats; q2 rises
    s2 = np.array([[-2.0, -2.0]])                                # answered at once: no gain
    m = information_metrics([s1, None, s2])
    assert m["info/scored_share"] == pytest.approx(2 / 3)
    assert m["info/logp_turn1_mean"] == pytest.approx(-13 / 4) and m["info/logp_turn3_mean"] == pytest.approx(-1.75)
    assert m["info/gain_turn1_mean"] == pytest.approx((4 + 0) / 2) and m["info/gain_turn2_mean"] == pytest.approx(
        (-2 + 3.5) / 2)
    assert m["info/gain_mean"] == pytest.approx((4 + 0 - 2 + 3.5) / 4)
    assert m["info/rose_share"] == pytest.approx(2 / 4)       # s1's two questions rose; s2's did not
    assert m["info/lost_share"] == pytest.approx(1 / 4)       # s1's q1: 2 nats below its peak
    assert information_metrics([None]) == {"info/scored_share": 0.0}


def _traj(group, golds):
    return Trajectory(traj_id=0, group_id=group, question="q", golds=golds, objectives=["a?", "b?"])


def test_bonus_pays_gains_of_right_answers_and_is_normalised_within_the_group():
    golds = [["x"], ["y"]]
    s = lambda g1, g2: np.array([[-5.0, -5.0], [-5.0 + g1, -5.0 + g2]])
    ok = lambda answer: RewardResult(reward=1.0, em=1.0, f1=1.0, format_ok=True, answer=answer)
    trajs = [_traj(0, golds) for _ in range(5)] + [_traj(1, golds)]
    scores = [s(4, 2), s(4, 2), s(1, 6), s(3, 3), s(2, 2), s(5, 5)]
    results = [ok("x; y"), ok("x; wrong"), ok("x; y"), RewardResult(0.0, 0.0, 0.0, False, "x; y"), ok("no; no"),
               ok("x; y")]
    bonus, eligible = information_bonus(scores, trajs, results)
    # Both right: the mean gain; one right: its gain alone counts; malformed or none right: nothing.
    assert bonus.tolist() == [3.0, 2.0, 3.5, 0.0, 0.0, 5.0]
    assert eligible.tolist() == [True, True, True, False, False, True]
    adv = np.array([0.5, -0.5, 0.25, -1.0, 0.75, 0.0], np.float32)
    assert shaped_advantages(adv, bonus, eligible, [t.group_id for t in trajs], 0.0) is adv
    shaped = shaped_advantages(adv, bonus, eligible, [t.group_id for t in trajs], 2.0)
    # Group 0's eligible bonuses 3, 2, 3.5: mean 2.833.., unbiased std 0.7638; the rest unchanged
    # (group 1 has one eligible trajectory: nothing to compare it with).
    z = (np.array([3.0, 2.0, 3.5]) - 17 / 6) / np.std([3.0, 2.0, 3.5], ddof=1)
    assert shaped[:3] == pytest.approx(adv[:3] + 2.0 * z, abs=1e-5)
    assert shaped[3:].tolist() == adv[3:].tolist() and shaped.dtype == np.float32


# ---------------------------------------------------------------- each design's carried context

class _RecordingReplay(_ReplaySampler):
    """The demonstrations' replay sampler, keeping every prompt it was asked for."""

    def __init__(self, demos, eos_id):
        super().__init__(demos, eos_id)
        self.prompts = []

    def generate(self, prompts, **kw):
        self.prompts += [list(p) for p in prompts]
        return super().generate(prompts, **kw)


@pytest.mark.parametrize("workflow", ["memsearcher", "react", "mem1", "memory_ops", "summary", "fold"])
def test_each_turns_carried_context_is_what_its_prompt_was_built_from(reading, workflow):
    """Two-question demonstrations replayed through AgentRunner: turn k's recorded carried context
    is the span of the prompt the sampler got for turn k's act at the recorded place, and it is
    exactly what the design carries: memsearcher the memory text written at turn k-1, memory_ops
    the bank, mem1 the last act and its observation, react every act and observation so far, summary
    and fold their segment's or branch's history, after the summary or the returns that opened it.
    It fails if the span were the whole prompt, a fixed offset, or another turn's."""
    from memsearcher_jax.agent.workflows.summary import DEMO_SUMMARY_BUDGET
    from memsearcher_jax.data.demos import DemoConfig, make_demonstrations
    from memsearcher_jax.data.synthetic import join_objectives

    _, b, world, retriever = reading
    rows = join_objectives(world.train[:40], 2, seed=0)
    demos = make_demonstrations(rows[:6], b, retriever, seed=0, config=DemoConfig(0, 0, 0, workflow=workflow,
                                                                                 max_turns=6))
    if workflow in ("summary", "fold"):  # a summary or a fold happens in some of them
        assert any(len(d.conversations) > 1 for d in demos)
    for d in demos:
        sampler = _RecordingReplay([d], b.eos_id)
        (t,) = AgentRunner(b, sampler, retriever, AgentConfig(workflow=workflow, max_turns=6,
                                                              summary_budget=DEMO_SUMMARY_BUDGET)).run([d.row])
        acts = [p for p in sampler.prompts if p[-1] == b.think_id]
        assert t.end_reason == "answer" and len(t.carried) == len(acts) == t.turns >= 3
        assert t.objectives == [o["question"] for o in d.row["objectives"]]
        for k, prompt in enumerate(acts):
            conv_index, start, end = t.carried[k]
            conv = t.conversations[conv_index]
            assert (conv.prompt_ids + conv.response_ids)[:len(prompt)] == prompt  # the act's own conversation
            carried = t.carried_ids(k)
            assert carried == prompt[start:end]
            if k == 0:
                assert carried == []
            elif workflow in ("memsearcher", "memory_ops"):
                assert b.decode(carried).strip() == t.memories[k - 1].strip() != ""
            elif workflow in ("summary", "fold"):  # the first context; or the carried text, then the history
                first, tail = t.conversations[0].prompt_ids, len(prompt) - end  # the frame: its head and end
                assert prompt[:start] == first[:start] and prompt[end:] == first[len(first) - tail:] and tail <= 8
                if conv_index:  # the summary, or the last return, that opened this segment or branch
                    assert t.memories[conv_index - 1].split("\n")[-1] in b.decode(carried)
            elif workflow == "mem1":  # the question's first context, then exactly what it carries
                assert prompt[:start] == mem1_first_context(b, t.question) and end == len(prompt)
                assert carried[:len(t.conversations[k - 1].response_ids)] == t.conversations[k - 1].response_ids
            else:  # react: the question's context, then the whole history
                assert prompt[:start] == b.react_context(t.question) and end == len(prompt)


@pytest.mark.parametrize("workflow", ["memsearcher", "react", "mem1", "memory_ops"])
def test_the_hint_line_is_not_carried(reading, workflow):
    """With MEM1's hint line (agent.hint) ending each act's user message, the carried span stops
    before this turn's hint: memsearcher's and memory_ops' memory (and the tag that closes it: the
    hint, not the memory, now follows the first prompt's), react's and mem1's history up to the hint
    that closes their last observation."""
    from memsearcher_jax.agent.workflows.base import turn_hint
    from memsearcher_jax.data.demos import DemoConfig, make_demonstrations
    from memsearcher_jax.data.synthetic import join_objectives

    tok, _, world, retriever = reading
    b = PromptBuilder(tok, style="compact", default_top_n=2, hint="turns_and_questions")
    rows = join_objectives(world.train[:40], 2, seed=0)
    demos = make_demonstrations(rows[:4], b, retriever, seed=0, config=DemoConfig(0, 0, 0, workflow=workflow,
                                                                                 max_turns=6))
    for d in demos:
        sampler = _RecordingReplay([d], b.eos_id)
        (t,) = AgentRunner(b, sampler, retriever, AgentConfig(workflow=workflow, max_turns=6)).run([d.row])
        acts = [p for p in sampler.prompts if p[-1] == b.think_id]
        assert len(t.carried) == len(acts) >= 3
        for k, prompt in enumerate(acts[1:], 1):
            _, start, end = t.carried[k]
            hint = turn_hint(b, types.SimpleNamespace(max_turns=t.max_turns, unsearched_questions=lambda: 0), k)
            assert hint.startswith("turns left: ") and b.decode(prompt).count("turns left: ") >= 1
            assert t.carried_ids(k) == prompt[start:end] and b.decode(prompt[end:]).lstrip().startswith(
                hint.split(";")[0])  # this turn's hint comes right after the span
            if workflow in ("memsearcher", "memory_ops"):  # the memory, then only its closing tag
                text = b.decode(t.carried_ids(k)).strip()
                assert text.removesuffix("</memory>").strip() == t.memories[k - 1].strip() != ""


def test_a_workflow_without_a_frame_change_gets_the_differing_span():
    assert differing_span([1, 2, 3, 9], [1, 2, 3, 9]) == (4, 4)
    assert differing_span([1, 2, 3, 9], [1, 2, 3, 7, 7, 9]) == (3, 5)
    assert differing_span([1, 2, 0, 9], [1, 2, 5, 6, 9]) == (2, 4)
    assert differing_span([1, 2], [1, 2, 5, 6]) == (2, 4)
    assert differing_span([4, 9], [4, 9, 4, 9]) == (2, 4)  # prefix and suffix never overlap


# ---------------------------------------------------------------- coefficient 0: bit-identical

class _ScriptedPolicy:
    """Even rows search once, keep a fact of their own in memory and answer right; odd rows answer
    wrong. A trainer's sampler: update_params takes the new weights and changes nothing."""

    def __init__(self, tok, b):
        self.tok, self.b, self.acts = tok, b, {}

    def generate(self, prompts, *, max_new_tokens, row_seeds=None, **kw):
        out = []
        for p, row in zip(prompts, row_seeds):
            if p[-1] == self.b.think_id:
                k = self.acts[row] = self.acts.get(row, -1) + 1
                answer = "x</think>\\boxed{" + ("1950" if row % 2 == 0 else "1960") + "}"
                text = ('x</think>\n<tool_call>{"name": "wikipedia_search", "arguments": {"query": "Bolin", '
                        '"top_n": 1}}</tool_call>' if k == 0 else answer)
            else:
                text = f"<memory>Bolin was born in the year 19{50 + row}.</memory>"
            ids = self.tok.encode(text, add_special_tokens=False) + [self.b.eos_id]
            out.append(types.SimpleNamespace(tokens=ids, logprobs=[-0.5] * len(ids), finish_reason="stop"))
        return out

    def update_params(self, model):
        pass


class _Docs:
    def search(self, queries, top_n):
        return [[Hit("0", "Bolin\nBolin was born in the year 1950.")] for _ in queries]


def _one_step(reading, tmp_path, signal, coef):
    from flax import nnx

    from memsearcher_jax.models import ModelConfig, Qwen2
    from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig
    from memsearcher_jax.rl.trainer import LoopConfig, Trainer

    tok, b, _, _ = reading
    model = Qwen2(ModelConfig.tiny(vocab_size=3520, num_layers=1), rngs=nnx.Rngs(0))
    learner = GRPOLearner(model, GRPOConfig(min_seq_len=64, optimizer_steps=2, micro_batch_size=4, logprob_batch_size=8,
                                            optim=OptimConfig(learning_rate=1e-3)))
    runner = AgentRunner(b, _ScriptedPolicy(tok, b), _Docs(), AgentConfig(max_turns=3))
    loop = LoopConfig(steps=1, batch_questions=1, group_size=4, seed=0, output_dir=str(tmp_path / f"{signal}{coef}"),
                      info_signal=signal, info_coef=coef)
    trainer = Trainer(learner, runner, [{"question": "What year was Bolin born?", "golden_answers": ["1950"]}],
                      b.pad_id, loop, progress=False)
    metrics = trainer.train_step()
    return metrics, [np.asarray(x) for x in jax.tree.leaves(learner.params)]


@pytest.mark.slow
def test_coefficient_zero_is_bit_identical(reading, tmp_path):
    """One GRPO step of a tiny model on scripted episodes: with the signal off, logged, or as a
    reward with coefficient 0, the loss, the update's metrics and every weight are identical; with
    coefficient 1 the weights move differently (the signal reaches the update)."""
    off, w_off = _one_step(reading, tmp_path, "off", 0.0)
    assert not any(k.startswith("info/") for k in off)
    for signal in ("log", "reward"):
        got, w = _one_step(reading, tmp_path, signal, 0.0)
        assert got["info/scored_share"] == 1.0 and got["info/gain_turn1_mean"] != 0
        for k in ("loss", "grad_norm", "approx_kl", "entropy", "clip_fraction", "ratio_max", "ratio_min",
                  "reward_mean", "trained_tokens", "rows"):
            assert got[k] == off[k], (signal, k)
        assert all(np.array_equal(a, c) for a, c in zip(w, w_off)), signal
    shaped, w = _one_step(reading, tmp_path, "reward", 1.0)
    assert shaped["info/eligible_share"] == 0.5
    assert not all(np.array_equal(a, c) for a, c in zip(w, w_off))


def test_the_config_rules_name_the_info_keys():
    import os

    from memsearcher_jax.rules.config_rules import config_problems, info_problems
    from memsearcher_jax.settings.config_utils import load_config

    assert info_problems("off", 0.0) == info_problems("log", 0) == info_problems("reward", 0.5) == []
    assert "rl.info_signal must be one of 'off', 'log', 'reward', got 'on'" in info_problems("on", 0.0)[0]
    for bad in (-0.1, float("nan"), "1"):
        assert info_problems("reward", bad)[0].startswith("rl.info_coef must be a finite number >= 0")
    assert "only with rl.info_signal='reward'" in info_problems("log", 0.5)[0]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_config(os.path.join(root, "configs", "default.py"), [("rl.info_signal", "logs")])
    assert any(p.startswith("rl.info_signal must be one of") for p in config_problems(cfg, files=False))
