"""Multi-context GRPO: rows from the turn loop, loss masks, exact gradient accumulation, the update."""
from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.models import ModelConfig, Qwen2
from memsearcher_jax.rl.batching import minibatch_row_indices, pack_rows
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig, score_trajectories, trajectory_advantages
from memsearcher_jax.rl.losses import LossConfig, aggregation_weights
from retrieval.base import Hit
from tests.reference import token_logprobs


@dataclasses.dataclass
class Out:
    tokens: list
    logprobs: list
    finish_reason: str


class ScriptedSampler:
    """Replies from a script keyed on (question, phase, memory): no model, exact token streams."""

    def __init__(self, tok, builder, searches_before_answer: dict[str, int]):
        self.tok, self.b, self.plan = tok, builder, searches_before_answer
        self.emitted: list[list[int]] = []

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, top_k, stop_token_ids, seed, row_seeds=None):
        outs = []
        for p in prompts:
            text = self.tok.decode(p)
            q = text.split("<question> ")[-1].split(" </question>")[0]
            memory = text.split("</question>\n<memory> ")[1].split("</memory>")[0]
            done = memory.count("fact")
            if p[-1] == self.b.think_id:  # act
                if done >= self.plan[q]:
                    body = "ok</think>\n\\boxed{Paris}"
                else:
                    call = json.dumps({"name": "wikipedia_search", "arguments": {"query": f"q{done}"}})
                    body = f"go</think>\n<tool_call>{call}</tool_call>"
            else:  # memory update
                body = "<memory>" + " ".join(["fact"] * (done + 1)) + "</memory>"
            ids = self.tok.encode(body, add_special_tokens=False) + [self.b.eos_id]
            self.emitted.append(ids)
            outs.append(Out(ids, [-0.5] * len(ids), "stop"))
        return outs


class EchoRetriever:
    def __init__(self):
        self.calls = []

    def search(self, queries, top_n):
        self.calls.append(list(queries))
        return [[Hit(id=f"{q}-{i}", contents=f"Title {q}\ntext {i}") for i in range(top_n)] for q in queries]


@pytest.fixture(scope="module")
def qwen_tok():
    from transformers import AutoTokenizer

    from tests.assets import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir())


def test_k_conversations_give_k_rows_with_one_advantage_and_exact_masks(qwen_tok):
    b = PromptBuilder(qwen_tok, default_top_n=2)
    plan = {"Where is A?": 0, "Where is B?": 4, "Where is C?": 2}
    sampler = ScriptedSampler(qwen_tok, b, plan)
    retriever = EchoRetriever()
    runner = AgentRunner(b, sampler, retriever, AgentConfig(max_turns=5, max_new_tokens=64, default_top_n=2))
    qs = [{"question": q, "golden_answers": ["Paris"] if q != "Where is C?" else ["London"]} for q in plan]
    trajs = runner.run(qs, group_size=2, seed=0)
    # One batched retriever call per turn that had searches, covering every searching row.
    assert [len(c) for c in retriever.calls] == [4, 4, 2, 2]
    by_q = {}
    for t in trajs:
        by_q.setdefault(t.question, []).append(t)
        assert len(t.conversations) == plan[t.question] + 1
        assert t.end_reason == "answer"
        assert [c.turn for c in t.conversations] == list(range(len(t.conversations)))
        assert [c.is_final for c in t.conversations] == [False] * plan[t.question] + [True]
    results = score_trajectories(trajs)
    rewards = [r.reward for r in results]
    assert rewards == [1.0, 1.0, 1.0, 1.0, 0.1, 0.1]  # C answers Paris, gold London: format credit
    # Group 2 has rewards (0.1, 0.1): zero advantage. Make group 0 unequal to see non-zero ones.
    rewards[0] = 0.0
    adv = trajectory_advantages(trajs, rewards)
    rows = pack_rows(trajs, adv, b.pad_id, min_len=16)
    assert rows.num_rows == sum(len(t.conversations) for t in trajs) == 2 * (1 + 5 + 3)
    for t in trajs:
        idx = np.where(rows.traj_ids == t.traj_id)[0]
        assert len(idx) == len(t.conversations)
        assert np.all(rows.advantages[idx] == adv[t.traj_id])
    assert adv[0] == pytest.approx(-0.5 / np.sqrt(0.5), rel=1e-5) and adv[4] == 0.0
    # Loss mask: 1 exactly on the sampler's emitted tokens, 0 on prompt/observation/padding.
    for r in range(rows.num_rows):
        conv = [c for t in trajs for c in t.conversations][r]
        p = len(conv.prompt_ids)
        resp = rows.tokens[r, p:p + len(conv.response_ids)]
        m = rows.loss_mask[r, p:p + len(conv.response_ids)]
        assert rows.loss_mask[r, :p].sum() == 0 and rows.loss_mask[r, p + len(conv.response_ids):].sum() == 0
        generated = [tok for tok, mm in zip(resp, m) if mm == 1]
        injected = [tok for tok, mm in zip(resp, m) if mm == 0]
        # The generated tokens are the act (+ memory update), each ending with <|im_end|>.
        text = qwen_tok.decode(generated)
        assert text.count("<|im_end|>") == (1 if conv.is_final else 2)
        if not conv.is_final:
            assert "<tool_response>" in qwen_tok.decode(injected) and "<tool_response>" not in text
            assert injected[-3:] == b.observation([[Hit("x", "t\nx")]])[-3:]  # ends with the assistant header
        assert np.all(rows.sampler_logp[r][rows.loss_mask[r] == 1] == -0.5)


def _random_rows(rng, n, s, vocab):
    tokens = rng.integers(0, vocab, (n, s)).astype(np.int32)
    lengths = rng.integers(s // 2, s + 1, n)
    attention = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
    prompt = rng.integers(2, s // 2, n)
    mask = ((np.arange(s)[None] >= prompt[:, None]) & (attention == 1)).astype(np.float32)
    mask[:, ::5] = 0  # observation holes
    return tokens, attention, mask


@pytest.mark.parametrize("mode", ["token_mean", "trajectory_mean", "microbatch_token_mean"])
@pytest.mark.slow
def test_micro_batches_of_like_length_give_the_one_batch_gradient(mode):
    # The learner's own path: rows regrouped by length into micro-batches each only as wide as its
    # longest row, gradients summed over them, equal the gradient of the weighted loss over the whole
    # batch at full width, the weights being those of the rows split in order (so microbatch_token_mean
    # keeps its meaning). For token_mean and trajectory_mean that is the one-batch gradient itself.
    from memsearcher_jax.rl.batching import RowBatch
    from memsearcher_jax.rl.grpo import micro_batch_loss

    cfg = ModelConfig.tiny(vocab_size=64, num_layers=1)
    n, s, mbs = 8, 40, 2
    learner = GRPOLearner(Qwen2(cfg, rngs=nnx.Rngs(0)),
                          GRPOConfig(logprob_batch_size=16, micro_batch_size=mbs, min_seq_len=8,
                                     loss=LossConfig(aggregation=mode),
                                     pack_rows=False))  # the unpacked path (tests/test_packing.py: packed == unpacked)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (n, s)).astype(np.int32)
    lengths = np.array([40, 7, 23, 12, 40, 31, 9, 18])
    attention = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
    mask = ((np.arange(s)[None] >= lengths[:, None] // 2) & (attention == 1)).astype(np.float32)
    mask[:, ::5] = 0  # observation holes
    traj = np.array([0, 0, 1, 2, 2, 2, 3, 4])
    old = rng.normal(-3, 0.3, (n, s)).astype(np.float32)
    ref = rng.normal(-3, 0.3, (n, s)).astype(np.float32)
    rows = RowBatch(tokens=tokens, attention=attention, loss_mask=mask, sampler_logp=np.zeros((n, s), np.float32),
                    advantages=rng.normal(size=n).astype(np.float32), traj_ids=traj, group_ids=traj // 2,
                    turns=np.zeros(n, int), is_final=np.ones(n, bool))
    idx = rng.permutation(n)

    micro, denom = learner._micro_batches(rows, idx, old, ref, None)
    assert len({mb["tokens"].shape[1] for mb in micro}) > 1  # the widths really differ
    acc = learner._zero_sums(learner.params)
    for mb in micro:
        acc = learner._accumulate(acc, learner.params, None, mb)
    grads, loss = jax.tree.map(lambda g: g / denom, acc[0]), float(acc[1]) / denom

    weights, denom_ref = aggregation_weights(mode, mask[idx], traj[idx], np.arange(n) // mbs, n // mbs)
    whole = {"tokens": tokens[idx], "attention": attention[idx], "loss_mask": mask[idx], "weights": weights,
             "advantages": rows.advantages[idx], "old_logp": old[idx], "ref_logp": ref[idx]}
    # Jitted: run op by op, this gradient compiled ~300 small programs (most of the test's time).
    whole_grad = jax.jit(jax.value_and_grad(micro_batch_loss, has_aux=True), static_argnums=(1, 3))
    (loss_ref, _), g_ref = whole_grad(
        learner.params, learner.graphdef, {k: jnp.asarray(v) for k, v in whole.items()}, learner.config.loss)
    assert denom == pytest.approx(denom_ref)
    assert loss == pytest.approx(float(loss_ref) / denom_ref, rel=1e-5)
    flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(grads)])
    flat_ref = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g_ref)]) / denom_ref
    assert np.linalg.norm(flat_ref) > 0
    assert np.linalg.norm(flat - flat_ref) / np.linalg.norm(flat_ref) < 1e-5


def test_logprobs_in_chunks_of_like_length_equal_the_full_width_pass():

    model = Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(3))
    learner = GRPOLearner(model, GRPOConfig(logprob_batch_size=3, min_seq_len=8, pack_rows=False))
    rows = _toy_rows(n=7, s=40, seed=2)
    rows.attention[:3, 12:] = 0  # three short rows: a narrower chunk
    got = learner.compute_logprobs(learner.params, rows)
    full = np.asarray(token_logprobs(model, jnp.asarray(rows.tokens), jnp.asarray(rows.attention)))
    read = (rows.loss_mask != 0) & (rows.attention == 1)  # the positions the loss reads: computed there, 0 elsewhere
    assert read.sum() > 0 and got.shape == rows.tokens.shape and np.abs(got - full)[read].max() < 1e-5


def test_loss_windows_cover_every_loss_position_with_few_shapes():
    from memsearcher_jax.rl.batching import loss_windows

    mask = np.zeros((4, 40), np.float32)
    mask[0, 30:35] = 1          # a late response: 30 + 16 > 40, so its window ends at 39 too
    mask[1, 3:9] = 1            # early
    mask[1, 12] = 1             # a second part after an observation hole: span 3..12
    mask[2, 38:40] = 1          # at the very end: the window is moved left to end at column 39
    at = loss_windows(mask, 40, 8)  # row 3: no loss positions (a padding row)
    assert at.shape == (4, 16)      # span 10 -> the whole-octave bucket 16 (from min_window 8)
    for i in range(3):
        assert set(np.flatnonzero(mask[i])) <= set(at[i]) and np.all(np.diff(at[i]) == 1)
    assert at[1, 0] == 3 and at[3, 0] == 1                # a window starts at the first loss position
    assert at[0, -1] == 39 and at[2, -1] == 39           # ... unless it would run past the last column
    assert at.min() >= 1 and at.max() <= 39
    # Never wider than the row allows (width - 1 targets), whatever the span.
    wide = np.zeros((2, 24), np.float32)
    wide[0, 1:24] = 1
    assert loss_windows(wide, 24, 8).tolist() == [list(range(1, 24))] * 2
    with pytest.raises(ValueError, match="position 0"):
        loss_windows(np.ones((1, 8), np.float32), 8, 4)


def _toy_rows(n=6, s=16, vocab=64, seed=0):
    from memsearcher_jax.rl.batching import RowBatch

    rng = np.random.default_rng(seed)
    tokens, attention, mask = _random_rows(rng, n, s, vocab)
    return RowBatch(tokens=tokens, attention=attention, loss_mask=mask, sampler_logp=np.zeros((n, s), np.float32),
                    advantages=rng.normal(size=n).astype(np.float32), traj_ids=np.arange(n),
                    group_ids=np.arange(n) // 2, turns=np.zeros(n, int), is_final=np.ones(n, bool))


def test_learner_updates_params_and_skips_non_finite_steps():
    cfg = ModelConfig.tiny(vocab_size=64, num_layers=1)
    learner = GRPOLearner(Qwen2(cfg, rngs=nnx.Rngs(1)),
                          GRPOConfig(min_seq_len=64, optimizer_steps=2, micro_batch_size=2, logprob_batch_size=4,
                                     optim=OptimConfig(learning_rate=1e-3)))
    before = jax.tree.map(np.asarray, learner.params)
    rows = _toy_rows()
    m = learner.train_on_rows(rows, np.random.default_rng(0))
    after = jax.tree.map(np.asarray, learner.params)
    changed = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))]
    assert all(changed)
    assert m["skipped"] == 0 and learner.skipped_steps == 0
    # First mini-batch: policy == old policy, so no ratio moved away from 1 before any update.
    assert m["ratio_min"] <= 1.0 + 1e-6
    # Reference stays frozen at the initial weights.
    assert all(np.array_equal(np.asarray(r), b) for r, b in zip(jax.tree.leaves(learner.ref_params),
                                                               jax.tree.leaves(before)))
    bad = _toy_rows(seed=1)
    bad.advantages[:] = np.nan
    m2 = learner.train_on_rows(bad, np.random.default_rng(1))
    assert m2["skipped"] == 2 and learner.skipped_steps == 2
    assert all(np.array_equal(np.asarray(a), b) for a, b in zip(jax.tree.leaves(learner.params),
                                                               jax.tree.leaves(after)))


@pytest.mark.parametrize("shuffle", [True, False])
def test_trajectory_mean_keeps_each_trajectory_in_one_minibatch(shuffle):
    # 7 trajectories with 1..5 conversations each, split over 3 optimizer steps.
    traj_ids = np.array([t for t, k in enumerate([1, 5, 2, 3, 1, 4, 2]) for _ in range(k)])
    rng = np.random.default_rng(0)
    chunks = minibatch_row_indices(traj_ids, 3, rng, shuffle=shuffle, whole_trajectories=True)
    assert len(chunks) == 3
    assert sorted(np.concatenate(chunks).tolist()) == list(range(len(traj_ids)))
    owners = [set(traj_ids[c].tolist()) for c in chunks]
    assert all(not (a & b) for i, a in enumerate(owners) for b in owners[i + 1:])  # no trajectory split
    # So within each optimizer step every present trajectory weighs exactly 1 in total.
    mask = np.ones((len(traj_ids), 4))
    for c in chunks:
        w, denom = aggregation_weights("trajectory_mean", mask[c], traj_ids[c], np.zeros(len(c), np.int64), 1)
        per_traj = {t: w[traj_ids[c] == t].sum() for t in set(traj_ids[c].tolist())}
        assert np.allclose(list(per_traj.values()), 1.0) and denom == len(per_traj)
    # The row-shuffling modes do split trajectories (that is fine for a token mean).
    row_chunks = minibatch_row_indices(traj_ids, 3, np.random.default_rng(0), shuffle=True)
    assert sorted(np.concatenate(row_chunks).tolist()) == list(range(len(traj_ids)))


def _trained(rows, tis_cap):
    cfg = ModelConfig.tiny(vocab_size=64, num_layers=1)
    learner = GRPOLearner(Qwen2(cfg, rngs=nnx.Rngs(1)),
                          GRPOConfig(min_seq_len=64, optimizer_steps=1, micro_batch_size=6, logprob_batch_size=6,
                                     loss=LossConfig(tis_cap=tis_cap), optim=OptimConfig(learning_rate=1e-3)))
    learner.train_on_rows(rows, np.random.default_rng(0))
    return jax.tree.leaves(jax.tree.map(np.asarray, learner.params))


def test_truncated_importance_sampling_reaches_the_update():
    from memsearcher_jax.models import Qwen2 as _Q

    rows = _toy_rows()
    # The sampler agreed with the trainer: every weight is min(1, cap) = 1, the same update as without TIS.
    model = _Q(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(1))
    rows.sampler_logp = np.asarray(token_logprobs(model, jnp.asarray(rows.tokens), jnp.asarray(rows.attention)))
    plain, agreed = _trained(rows, 0.0), _trained(rows, 2.0)
    assert max(float(np.abs(a - b).max()) for a, b in zip(plain, agreed)) < 1e-6
    # The sampler found the tokens likelier than the trainer does: weights < 1, a smaller update.
    rows.sampler_logp = rows.sampler_logp + 1.0
    shrunk = _trained(rows, 2.0)
    initial = jax.tree.leaves(jax.tree.map(np.asarray, nnx.split(model, nnx.Param)[1]))
    step = lambda got: sum(float(np.abs(a - b).sum()) for a, b in zip(got, initial))
    assert step(shrunk) < step(plain)


def _learner(optimizer_steps, aggregation="token_mean", **loss):
    return GRPOLearner(Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(1)),
                       GRPOConfig(optimizer_steps=optimizer_steps, micro_batch_size=2, logprob_batch_size=4,
                                  min_seq_len=64, loss=LossConfig(aggregation=aggregation, **loss),
                                  optim=OptimConfig(learning_rate=1e-3)))


@pytest.mark.parametrize("aggregation", ["token_mean", "trajectory_mean"])
def test_empty_minibatches_are_skipped_not_stepped(aggregation):
    # 3 rows of 2 trajectories: 2 mini-batches under trajectory_mean, 3 under token_mean; asking
    # for 5 optimizer steps leaves the rest empty. An empty mini-batch has nothing to learn:
    # no AdamW step on zero gradients (momentum and weight decay would still move the weights)
    # and no place in the loss average. So 5 requested steps train exactly like the non-empty count.
    rows = _toy_rows(n=3)
    rows.traj_ids = np.array([0, 0, 1])
    non_empty = 2 if aggregation == "trajectory_mean" else 3
    asked, exact = _learner(5, aggregation), _learner(non_empty, aggregation)
    m_asked = asked.train_on_rows(rows, np.random.default_rng(0))
    m_exact = exact.train_on_rows(rows, np.random.default_rng(0))
    for a, b in zip(jax.tree.leaves(asked.params), jax.tree.leaves(exact.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert m_asked["loss"] == m_exact["loss"]
    assert m_asked["empty_minibatches"] == 5 - non_empty and m_exact["empty_minibatches"] == 0


def test_minibatches_without_a_loss_token_are_skipped_not_stepped():
    # Rows 2 and 3 hold no loss token (e.g. an episode that ended before generating anything); in
    # order, they are the second of two mini-batches. It has no gradient, so it must take no
    # AdamW step (momentum from the first would still move every weight): 2 asked steps train
    # exactly like 1 step over the same rows, and the skipped one is counted.
    rows = _toy_rows(n=4)
    rows.loss_mask[2:] = 0
    two = GRPOLearner(Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(1)),
                      GRPOConfig(optimizer_steps=2, micro_batch_size=2, logprob_batch_size=4, min_seq_len=64,
                                 shuffle_rows=False, optim=OptimConfig(learning_rate=1e-3)))
    one = _learner(1)
    m_two = two.train_on_rows(rows, np.random.default_rng(0))
    m_one = one.train_on_rows(rows, np.random.default_rng(0))
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(one.ref_params)))
    assert moved > 1e-4  # the one real step moved the weights
    for a, b in zip(jax.tree.leaves(two.params), jax.tree.leaves(one.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    assert m_two["loss"] == pytest.approx(m_one["loss"], abs=1e-6)
    assert m_two["empty_minibatches"] == 1 and m_one["empty_minibatches"] == 0
    assert m_two["trained_tokens"] == m_one["trained_tokens"] > 0


def _window_rows():
    """Row 0: two loss tokens at the end of a 40-token row; row 1: a loss span of 20 after an
    observation hole. One log-prob chunk per row gives row 0 a log-prob window 8 wide; in a
    micro-batch with row 1 its loss window is 32 wide, mostly outside its mask and its log-prob
    window (where old and reference log-probs are 0)."""
    from memsearcher_jax.rl.batching import RowBatch

    rng = np.random.default_rng(5)
    n, s = 2, 40
    tokens = rng.integers(0, 64, (n, s)).astype(np.int32)
    attention = np.ones((n, s), np.int32)
    mask = np.zeros((n, s), np.float32)
    mask[0, 38:40] = 1
    mask[1, 10:18] = mask[1, 24:30] = 1
    return RowBatch(tokens=tokens, attention=attention, loss_mask=mask, sampler_logp=np.zeros((n, s), np.float32),
                    advantages=np.array([1.0, -0.5], np.float32), traj_ids=np.arange(n), group_ids=np.zeros(n, int),
                    turns=np.zeros(n, int), is_final=np.ones(n, bool))


@pytest.mark.slow
def test_metrics_and_loss_read_only_loss_tokens_with_real_logprobs():
    from memsearcher_jax.rl.grpo import micro_batch_loss, token_logprobs_and_entropy

    model = Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(4))
    learner = GRPOLearner(model, GRPOConfig(optimizer_steps=1, micro_batch_size=2, logprob_batch_size=1,
                                            min_seq_len=8, optim=OptimConfig(learning_rate=1e-3)))
    rows = _window_rows()
    old = learner.compute_logprobs(learner.params, rows)
    (mb,), denom = learner._micro_batches(rows, np.arange(2), old, old, None)
    at, mb_mask, mb_old = (np.asarray(mb[k]) for k in ("targets_at", "loss_mask", "old_logp"))
    row0 = np.flatnonzero(at[:, 0] == at[:, 0].max())[0]  # row 0's window is moved to end at column 39
    assert at.shape[1] > 8 and np.sum((mb_old[row0] == 0) & (mb_mask[row0] == 0)) > 8  # the case in question
    assert np.all(mb_old[mb_mask > 0] != 0)  # every loss token has its real old log-prob

    # Old / reference log-probs outside the loss tokens change nothing: loss, metric sums, gradient.
    # Jitted: both fills share one compile (run op by op, each call dispatched hundreds of programs).
    grad_fn = jax.jit(jax.value_and_grad(micro_batch_loss, has_aux=True), static_argnums=(1, 3))

    def run(fill):
        noisy = dict(mb, old_logp=jnp.where(mb["loss_mask"] > 0, mb["old_logp"], fill),
                     ref_logp=jnp.where(mb["loss_mask"] > 0, mb["old_logp"], -fill))
        return grad_fn(learner.params, learner.graphdef, {k: jnp.asarray(v) for k, v in noisy.items()},
                       learner.config.loss)
    (loss_a, sums_a), g_a = run(0.0)
    (loss_b, sums_b), g_b = run(30.0)
    assert float(loss_a) == pytest.approx(float(loss_b), abs=1e-6)
    for k in sums_a:
        assert float(sums_a[k]) == pytest.approx(float(sums_b[k]), abs=1e-5), k
    assert max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(g_a), jax.tree.leaves(g_b))) < 1e-6

    # One optimizer step: the policy is the old one, so every ratio is 1 and the KL 0, and the loss
    # is the token mean over the loss tokens of -A - 0.001 x entropy.
    _, ent = nnx.jit(token_logprobs_and_entropy)(model, jnp.asarray(rows.tokens), jnp.asarray(rows.attention))
    ent = np.asarray(ent)
    m = learner.train_on_rows(rows, np.random.default_rng(0))
    on = rows.loss_mask > 0
    expected = np.sum((-rows.advantages[:, None] - 0.001 * ent) * on) / on.sum()
    assert m["ratio_min"] == pytest.approx(1.0, abs=1e-5) and m["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert m["approx_kl"] == pytest.approx(0.0, abs=1e-6) and m["clip_fraction"] == 0.0
    assert m["entropy"] == pytest.approx(float(ent[on].mean()), rel=1e-5)
    assert m["loss"] == pytest.approx(float(expected), rel=1e-5)
    assert m["ratio_min_first"] == pytest.approx(1.0, abs=1e-5) and m["ratio_max_first"] == pytest.approx(1.0, abs=1e-5)

    # Two updates: the second mini-batch's ratios show the first update's drift, the first's stay 1.
    two = GRPOLearner(Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(4)),
                      GRPOConfig(optimizer_steps=2, micro_batch_size=2, logprob_batch_size=1, min_seq_len=8,
                                 shuffle_rows=False, optim=OptimConfig(learning_rate=1e-2)))
    m2 = two.train_on_rows(rows, np.random.default_rng(0))
    assert m2["ratio_min_first"] == pytest.approx(1.0, abs=1e-5)
    assert m2["ratio_max_first"] == pytest.approx(1.0, abs=1e-5)
    assert m2["ratio_max"] - m2["ratio_min"] > 1e-3



def test_tied_groups_drift_after_the_first_adamw_step_scales_with_lr():
    """Issue 56, 11b (docs/lab/2026-11-29-first-step-kl.md): every group tied (advantages 0), so only the
    entropy bonus pulls and its gradient is tiny; AdamW's first step, lr * g / (|g| + eps), still moves
    every weight by ~lr. The first mini-batch's ratios stay 1 (no mismatch between the passes); the
    second's drift from 1 is the first update's, linear in lr."""
    rows = _toy_rows()
    rows.advantages[:] = 0.0

    def step(lr):
        learner = GRPOLearner(Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(4)),
                              GRPOConfig(optimizer_steps=2, micro_batch_size=2, logprob_batch_size=1, min_seq_len=8,
                                         shuffle_rows=False, optim=OptimConfig(learning_rate=lr)))
        m = learner.train_on_rows(rows, np.random.default_rng(0))
        assert m["ratio_min_first"] == pytest.approx(1.0, abs=1e-6)
        assert m["ratio_max_first"] == pytest.approx(1.0, abs=1e-6)
        return max(-np.log(m["ratio_min"]), np.log(m["ratio_max"])), m["grad_norm"]

    (big, grad_norm), (small, _) = step(1e-3), step(1e-4)
    assert grad_norm < 0.05  # far below the clip (1.0): nothing scales the step down
    assert small > 1e-4 and big / small == pytest.approx(10.0, rel=0.15)


@pytest.mark.slow
def test_tis_log_ratio_clamp_is_the_configured_one():
    # The trainer finds the sampled tokens of half the rows e^3 times likelier than the sampler
    # did, the other half equally likely; with a large cap their TIS weights are
    # exp(min(3, log_ratio_clamp)) and 1. The clamp changes how the rows weigh against each
    # other, so the update's direction (AdamW normalises its scale away) must follow it.
    rows = _toy_rows()
    model = Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(1))

    trainer_logp = np.asarray(token_logprobs(model, jnp.asarray(rows.tokens), jnp.asarray(rows.attention)))
    rows.sampler_logp = trainer_logp - 3.0 * (np.arange(rows.num_rows) % 2)[:, None]

    def trained(clamp):
        learner = _learner(1, tis_cap=100.0, log_ratio_clamp=clamp)
        learner.train_on_rows(rows, np.random.default_rng(0))
        return [np.asarray(x) for x in jax.tree.leaves(learner.params)]

    loose, tight = trained(20.0), trained(0.5)
    assert max(float(np.abs(a - b).max()) for a, b in zip(loose, tight)) > 1e-5


@pytest.mark.parametrize("pack", [False, True])
def test_the_learner_scores_tokens_at_the_rollouts_temperature(pack):
    """Rollouts sampled at temperature T drew each token from softmax(logits / T): the old, the
    reference and the current log-probs (and the entropy bonus) are of that distribution, in the
    log-prob pass and in the loss alike (verl divides by the temperature the same way)."""
    from memsearcher_jax.rl.grpo import token_logprobs_and_entropy
    from tests.reference import row_log_probs

    model = Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(4))
    rows = _window_rows()
    on = rows.loss_mask > 0
    got = {}
    for t in (1.0, 0.5):
        learner = GRPOLearner(model, GRPOConfig(optimizer_steps=1, micro_batch_size=2, logprob_batch_size=1,
                                                min_seq_len=8, pack_rows=pack, loss=LossConfig(temperature=t)))
        old = learner.compute_logprobs(learner.params, rows)
        # The reference: a full forward's log_softmax(logits / t), row by row.
        want = np.zeros_like(old)
        for i in range(len(rows.tokens)):
            n = int(rows.attention[i].sum())
            lp = row_log_probs(model, rows.tokens[i, :n].tolist(), t)
            want[i, 1:n] = lp[np.arange(n - 1), rows.tokens[i, 1:n]]
        assert np.abs(old - want)[on].max() < 1e-5, t
        got[t] = old
        # The loss pass agrees with the log-prob pass (ratio 1 before any update) at this temperature,
        # and its entropy bonus is the tempered distribution's.
        _, ent = nnx.jit(token_logprobs_and_entropy, static_argnames=("temperature",))(
            model, jnp.asarray(rows.tokens), jnp.asarray(rows.attention), temperature=t)
        m = learner.train_on_rows(rows, np.random.default_rng(0))
        assert m["ratio_min_first"] == pytest.approx(1.0, abs=1e-5)
        assert m["ratio_max_first"] == pytest.approx(1.0, abs=1e-5)
        assert m["entropy"] == pytest.approx(float(np.asarray(ent)[on].mean()), rel=1e-5)
        model = Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(4))  # train_on_rows moved it
    # Scoring at 1.0 what was sampled at 0.5 is another distribution: the check has teeth.
    assert np.abs(got[1.0] - got[0.5])[on].max() > 0.05


def test_loss_config_refuses_a_temperature_that_samples_nothing():
    with pytest.raises(ValueError, match="temperature"):
        LossConfig(temperature=0.0)


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_no_reference_copy_without_a_kl_term(lora_rank):
    """rl.kl_coef=0: nothing reads the reference, so no copy of the weights (nor LoRA's zero
    adapters) is kept; with a KL term the reference is a copy of its own, frozen at the start."""
    from memsearcher_jax.app.plan_check import per_device_bytes

    def learner(kl):
        model = Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1, lora_rank=lora_rank), rngs=nnx.Rngs(1))
        return GRPOLearner(model, GRPOConfig(optimizer_steps=2, micro_batch_size=2, logprob_batch_size=4,
                                             min_seq_len=64, loss=LossConfig(kl_coef=kl),
                                             optim=OptimConfig(learning_rate=1e-3)))

    # (Training with no reference: tests/test_packing.py's kl_coef=0 steps.)
    without, with_kl = learner(0.0), learner(0.01)
    assert without.ref_params is None and per_device_bytes(without.ref_params) == 0
    assert per_device_bytes(with_kl.ref_params) == per_device_bytes(with_kl.params) > 0
