"""SFT warm start: row layout, masked loss ignores non-generated targets, and training learns the demos."""
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.agent.rollout import Conversation
from memsearcher_jax.data.demos import demo_conversations, make_demonstrations
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.world_cache import prepare_world
from memsearcher_jax.models import ModelConfig, Qwen2
from memsearcher_jax.rl.sft import (
    SFTConfig,
    SFTTrainer,
    _nll_sum_split,
    build_rows,
    evaluate_loss,
    loss_slots,
    masked_nll_sum,
    pack_rows,
    packed_nll_sum,
    sft_train,
)
from memsearcher_jax.sampling.buckets import bucket
from retrieval.bm25 import BM25Retriever
from tests.reference import forward


def nll_sum(model, inputs, targets, weights, lengths):
    """masked_nll_sum jitted with the parameters as arguments, as the SFT steps run it."""
    graphdef, params = nnx.split(model, nnx.Param)
    return _nll_sum_split(graphdef, params, *(jnp.asarray(a) for a in (inputs, targets, weights, lengths)))


def _jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    paths = prepare_world(str(tmp_path_factory.mktemp("world")), seed=4, num_entities=40)
    tok = load_tokenizer(paths.tokenizer_dir)
    builder = PromptBuilder(tok)
    retriever = BM25Retriever.from_passages(_jsonl(paths.corpus))
    demos = make_demonstrations(_jsonl(paths.train), builder, retriever, seed=0)
    return builder, len(tok), demo_conversations(demos)


def _model(vocab, seed=0):
    return Qwen2(ModelConfig.tiny(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_layers=2),
                 rngs=nnx.Rngs(seed))


def test_build_rows_layout():
    convs = [Conversation(prompt_ids=[5, 6, 7], response_ids=[8, 9, 10, 11], loss_mask=[1, 0, 0, 1]),
             Conversation(prompt_ids=[5], response_ids=[12], loss_mask=[1])]
    rows = build_rows(convs, pad_id=0, max_len=100)
    np.testing.assert_array_equal(rows.inputs[0], [5, 6, 7, 8, 9, 10])
    np.testing.assert_array_equal(rows.targets[0], [6, 7, 8, 9, 10, 11])
    # Only targets 8 and 11 are generated tokens.
    np.testing.assert_array_equal(rows.weights[0], [0, 0, 1, 0, 0, 1])
    np.testing.assert_array_equal(rows.weights[1], [1, 0, 0, 0, 0, 0])
    assert list(rows.lengths) == [6, 1] and rows.truncated == 0
    cut = build_rows(convs, pad_id=0, max_len=5)
    assert cut.truncated == 1 and cut.lengths[0] == 4 and cut.weights[0].sum() == 1
    with pytest.raises(ValueError, match="3 response ids but 2 mask values"):
        build_rows([Conversation(prompt_ids=[1], response_ids=[2, 3, 4], loss_mask=[1, 1])], 0, 10)


def test_bucket_for_and_config_errors():
    cfg = SFTConfig(min_len=256)  # the shared bucket rule: quarter octaves from min_len
    assert [cfg.bucket_for(n) for n in (1, 256, 257, 1024, 1500)] == [256, 256, 320, 1024, 1536]
    with pytest.raises(ValueError, match="lr must be > 0"):
        SFTConfig(lr=0)


def test_masked_out_targets_do_not_contribute(demos):
    builder, vocab, convs = demos
    model = _model(vocab)
    rows = build_rows(convs[:2], builder.pad_id, max_len=2048)
    args = [jnp.asarray(a) for a in (rows.inputs, rows.targets, rows.weights, rows.lengths)]
    base_sum, base_count = nll_sum(model, *args)
    assert base_count == rows.weights.sum() > 0

    # Change every target the mask excludes (prompt, observation, padding): loss unchanged.
    in_row = np.arange(rows.inputs.shape[1])[None, :] < rows.lengths[:, None]
    obs = (rows.weights == 0) & in_row
    targets = rows.targets.copy()
    targets[rows.weights == 0] = (targets[rows.weights == 0] + 17) % vocab
    s, c = nll_sum(model, args[0], jnp.asarray(targets), args[2], args[3])
    assert obs.sum() > 500
    np.testing.assert_allclose(float(s), float(base_sum), rtol=1e-6)
    assert float(c) == float(base_count)

    # Change one generated target: loss changes.
    targets = rows.targets.copy()
    r, t = np.argwhere(rows.weights == 1)[0]
    targets[r, t] = (targets[r, t] + 17) % vocab
    s, _ = nll_sum(model, args[0], jnp.asarray(targets), args[2], args[3])
    assert abs(float(s) - float(base_sum)) > 1e-3

    # Extra right padding (a larger bucket) changes nothing either.
    pad = 64
    wide = [np.concatenate([a, np.full((a.shape[0], pad), 3, a.dtype)], axis=1)
            for a in (rows.inputs, rows.targets)]
    wide_w = np.concatenate([rows.weights, np.ones((rows.weights.shape[0], pad), np.float32)], axis=1)
    s, c = nll_sum(model, jnp.asarray(wide[0]), jnp.asarray(wide[1]), jnp.asarray(wide_w), args[3])
    np.testing.assert_allclose(float(s), float(base_sum), rtol=1e-5)
    assert float(c) == float(base_count)


def test_sft_learns_a_pattern_fast():
    """Short rows: the masked response is a fixed function of the prompt, observations are noise."""
    rng = np.random.default_rng(1)
    convs = []
    for _ in range(32):
        prompt = rng.integers(10, 60, size=12).tolist()
        act = [60 + (t % 20) for t in prompt[:6]] + [2]
        obs = rng.integers(10, 90, size=8).tolist()  # masked: unpredictable on purpose
        update = [90, 91, prompt[0], 2]
        convs.append(Conversation(prompt_ids=prompt, response_ids=act + obs + update,
                                  loss_mask=[1] * len(act) + [0] * len(obs) + [1] * len(update)))
    cfg = SFTConfig(steps=60, batch_size=8, lr=1e-2, warmup=5, min_len=32, max_len=64, progress=False)
    model = _model(128, seed=1)
    before = evaluate_loss(model, convs, 0, cfg)
    trained, history = sft_train(model, convs, cfg, pad_id=0)
    after = evaluate_loss(trained, convs, 0, cfg)
    assert {h["length"] for h in history} == {32}
    assert after < 0.5 * before, (before, after)


def test_sft_train_stops_on_the_clock_and_takes_the_optimizer_it_is_given():
    # warm_start.extra_sft (the GRPO control) runs sft_train for a wall-clock budget at a constant rate.
    from memsearcher_jax.rl.learner import OptimConfig

    rng = np.random.default_rng(2)
    convs = [Conversation(prompt_ids=rng.integers(10, 60, 8).tolist(), response_ids=[60, 61, 2], loss_mask=[1, 1, 1])
             for _ in range(8)]
    cfg = SFTConfig(steps=10 ** 9, batch_size=4, warmup=0, min_len=16, max_len=32, progress=False)
    model = _model(128)
    _, none = sft_train(model, convs, cfg, optim=OptimConfig(learning_rate=1e-3), seconds=0.0)
    assert none == []
    _, some = sft_train(model, convs, dataclasses.replace(cfg, steps=3), optim=OptimConfig(learning_rate=1e-3),
                        seconds=3600.0)
    assert [h["step"] for h in some] == [0, 1, 2] and not any(h["skipped"] for h in some)



@pytest.mark.slow
def test_sft_train_moves_tied_embedding_rows_together():
    # warm_start.warm_start with sft.tie_embedding_rows: a group's rows (a type's names) get one update, so a
    # name the demonstrations never show (100) moves with the ones they do (70, 71); untied they part.
    rng = np.random.default_rng(3)
    convs = [Conversation(prompt_ids=rng.integers(10, 60, 8).tolist(), response_ids=[70, 71, 2], loss_mask=[1, 1, 1])
             for _ in range(8)]
    cfg = SFTConfig(steps=3, batch_size=4, lr=1e-2, warmup=0, min_len=16, max_len=32, progress=False)
    before = np.asarray(_model(128).embed[...])
    tied, _ = sft_train(_model(128), convs, cfg, tied_rows=[[70, 71, 100]])
    untied, _ = sft_train(_model(128), convs, cfg)
    moved, moved_alone = (np.asarray(m.embed[...]) - before for m in (tied, untied))
    assert np.abs(moved[70]).max() > 1e-4
    np.testing.assert_allclose(moved[71], moved[70], atol=1e-6)
    np.testing.assert_allclose(moved[100], moved[70], atol=1e-6)
    assert np.abs(moved_alone[100] - moved_alone[70]).max() > 1e-4


STEPS = 30


@pytest.mark.slow
def test_sft_lowers_masked_loss_on_demos(demos):
    builder, vocab, convs = demos
    # A few dozen steps on CPU: a small demo set seen several times, scored on itself.
    rng = np.random.default_rng(0)
    subset = [convs[i] for i in rng.choice(len(convs), 8, replace=False)]
    cfg = SFTConfig(steps=STEPS, batch_size=2, lr=1e-2, warmup=3, seed=0, max_len=1024, min_len=1024,
                    progress=False)
    model = _model(vocab)
    before = evaluate_loss(model, subset, builder.pad_id, cfg)
    t0 = time.perf_counter()
    trained, history = sft_train(model, subset, cfg, pad_id=builder.pad_id)
    elapsed = time.perf_counter() - t0
    after = evaluate_loss(trained, subset, builder.pad_id, cfg)
    assert len(history) == STEPS and all(np.isfinite(h["loss"]) for h in history)
    assert {h["length"] for h in history} == {1024}  # one bucket: one compilation
    assert after < 0.5 * before, (before, after, elapsed, [round(h["loss"], 2) for h in history])
    assert np.mean([h["loss"] for h in history[-5:]]) < 0.5 * history[0]["loss"]


def test_length_grouped_order_is_a_permutation_with_less_padding():
    from memsearcher_jax.rl.sft import length_grouped_order

    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 400, 1000)
    order = length_grouped_order(lengths, 8, np.random.default_rng(1))
    assert sorted(order.tolist()) == list(range(1000))
    padded = lambda o: sum(lengths[o[i:i + 8]].max() * 8 for i in range(0, 1000, 8))
    assert padded(order) < 0.8 * padded(np.random.default_rng(1).permutation(1000))
    # Still shuffled: not simply sorted.
    assert not np.all(np.diff(lengths[order]) >= 0)


def test_pack_rows_places_every_sequence_once_with_its_own_positions():
    convs = [Conversation(prompt_ids=[5, 6, 7], response_ids=[8, 9, 10, 11], loss_mask=[1, 0, 0, 1]),
             Conversation(prompt_ids=[5], response_ids=[12], loss_mask=[1]),
             Conversation(prompt_ids=[4, 4], response_ids=[13, 14], loss_mask=[1, 1]),
             Conversation(prompt_ids=list(range(20, 30)), response_ids=[31], loss_mask=[1])]
    packed = pack_rows(convs, pad_id=0, width=8)
    # Longest first, first fit: conv 3 is cut to 8 slots alone, conv 0 (6 slots) then 1 (1 slot)
    # share a row, conv 2 (3 slots) opens the third; 3 rows round up to the bucket of 4.
    assert packed.truncated == 1 and packed.inputs.shape == (4, 8)
    np.testing.assert_array_equal(packed.segments, [[3] * 8, [0] * 6 + [1, -1], [2, 2, 2] + [-1] * 5, [-1] * 8])
    np.testing.assert_array_equal(packed.positions[1], [0, 1, 2, 3, 4, 5, 0, 0])
    np.testing.assert_array_equal(packed.inputs[1], [5, 6, 7, 8, 9, 10, 5, 0])
    np.testing.assert_array_equal(packed.targets[1], [6, 7, 8, 9, 10, 11, 12, 0])
    np.testing.assert_array_equal(packed.weights[1], [0, 0, 1, 0, 0, 1, 1, 0])
    assert packed.weights[0].sum() == 0  # conv 3's one masked target was cut off
    # Nine full rows round up to a quarter-octave bucket of 10; the spare row weighs nothing.
    many = pack_rows([convs[3]] * 9, pad_id=0, width=10)
    assert many.inputs.shape[0] == bucket(9, 1, steps_per_octave=4) == 10
    assert (many.segments[9] == -1).all() and many.weights[9].sum() == 0 and many.weights[:9].sum() == 9


def test_packed_logits_equal_each_sequence_run_alone():
    model = _model(50)
    a, b = [3, 7, 11, 13, 17], [19, 23, 29]
    inputs = np.array([a + b + [0, 0]], np.int32)
    positions = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0, 0]], np.int32)
    segments = np.array([[0] * 5 + [1] * 3 + [-1, -1]], np.int32)
    packed = forward(model, jnp.asarray(inputs), positions=jnp.asarray(positions), segment_ids=jnp.asarray(segments))
    np.testing.assert_allclose(packed[0, :5], forward(model, jnp.asarray([a]))[0], atol=1e-5)
    np.testing.assert_allclose(packed[0, 5:8], forward(model, jnp.asarray([b]))[0], atol=1e-5)
    with pytest.raises(ValueError, match="explicit positions"):
        model(jnp.asarray(inputs), segment_ids=jnp.asarray(segments))


@pytest.mark.slow
def test_a_packed_step_is_the_padded_step(demos):
    """Same conversations, same loss and the same update, packed or padded."""
    builder, vocab, convs = demos
    convs = convs[:6]
    cfg = SFTConfig(min_len=64, steps=10, batch_size=6, warmup=0, max_len=2048, progress=False)
    padded, packed = SFTTrainer(_model(vocab), cfg), SFTTrainer(_model(vocab), cfg)
    width = 2 * max(len(c.prompt_ids) + len(c.response_ids) for c in convs)
    rows = pack_rows(convs, builder.pad_id, width)
    assert rows.inputs.shape[0] < 6  # some conversations shared a row
    a = padded.train_step(build_rows(convs, builder.pad_id, 2048), np.arange(6))
    b = packed.train_packed(rows)
    assert a["tokens"] == b["tokens"] > 0
    np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)
    np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-4)
    # Adam's first step is about lr * sign(grad): a gradient within rounding of 0 may move a
    # weight by up to ~lr either way, so compare to a small fraction of lr (1e-3).
    moved = 0.0
    for x, y, x0 in zip(jax.tree.leaves(padded.params), jax.tree.leaves(packed.params),
                        jax.tree.leaves(nnx.split(_model(vocab), nnx.Param)[1])):
        np.testing.assert_allclose(y, x, atol=2e-5)
        moved = max(moved, float(np.abs(np.asarray(x) - np.asarray(x0)).max()))
    assert moved > 5e-4  # the step did move the weights


def test_loss_slots_point_at_every_weighted_slot_and_pad_with_weight_zero():
    w = np.zeros((3, 50), np.float32)
    w[0, [3, 4, 5]] = 1
    w[2, 49] = 1
    at, weights = loss_slots(w)
    assert len(at) == len(weights) == 64  # the smallest bucket
    assert at[:4].tolist() == [3, 4, 5, 2 * 50 + 49] and weights[:4].tolist() == [1, 1, 1, 1]
    assert not weights[4:].any() and not at[4:].any()
    many = np.ones((4, 100), np.float32)
    at, weights = loss_slots(many)
    assert len(at) == 512 and weights.sum() == 400  # 64 doubled to the first that holds 400
    assert sorted(set(at[:400].tolist())) == list(range(400))


@pytest.mark.parametrize("packed", [False, True])
def test_the_head_at_loss_slots_gives_the_full_heads_sums_and_gradient(demos, packed):
    """Running the vocabulary head only where the loss reads changes nothing: same NLL sum,
    same token count, same gradient as the head over every slot."""
    builder, vocab, convs = demos
    convs = convs[:6]
    if packed:
        r = pack_rows(convs, builder.pad_id, 2 * max(len(c.prompt_ids) + len(c.response_ids) for c in convs))
        rows, fn = (r.inputs, r.targets, r.weights, r.positions, r.segments), packed_nll_sum
        slots = (r.loss_at, r.loss_weights)
    else:
        r = build_rows(convs, builder.pad_id, 2048)
        rows, fn = (r.inputs, r.targets, r.weights, r.lengths), masked_nll_sum
        inside = r.weights * (np.arange(r.weights.shape[1])[None, :] < r.lengths[:, None])
        slots = loss_slots(inside)
    assert len(slots[0]) < r.weights.size / 2  # the loss reads a minority of the slots
    graphdef, params = nnx.split(_model(vocab), nnx.Param)

    def loss(p, *extra):
        total, count = fn(nnx.merge(graphdef, p), *(jnp.asarray(a) for a in rows + extra))
        return total / count, (total, count)

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (full, (t_full, c_full)), g_full = grad(params)
    (part, (t_part, c_part)), g_part = grad(params, *slots)
    assert float(c_part) == float(c_full) == float(r.weights.sum()) > 0
    np.testing.assert_allclose(float(t_part), float(t_full), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_part)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-4)


@pytest.mark.slow
def test_causal_query_blocks_give_the_same_loss_and_gradient(demos):
    """Attention in query blocks, each against the keys up to its own end (train_query_block),
    equals attention over all keys, on packed rows (segments: the pretraining's batches)."""
    builder, vocab, convs = demos
    plain = _model(vocab)
    blocked = Qwen2(dataclasses.replace(plain.config, train_query_block=128), rngs=nnx.Rngs(0))
    graphdef_p, params = nnx.split(plain, nnx.Param)
    graphdef_b, _ = nnx.split(blocked, nnx.Param)
    r = pack_rows(convs[:6], builder.pad_id, 2 * max(len(c.prompt_ids) + len(c.response_ids) for c in convs[:6]))
    assert r.inputs.shape[1] > 2 * 128  # several blocks
    rows = (r.inputs, r.targets, r.weights, r.positions, r.segments, r.loss_at, r.loss_weights)

    def loss(prm, graphdef):
        total, count = packed_nll_sum(nnx.merge(graphdef, prm), *(jnp.asarray(a) for a in rows))
        return total / count

    grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    (a, ga), (b, gb) = grad(params, graphdef_p), grad(params, graphdef_b)
    np.testing.assert_allclose(float(b), float(a), rtol=1e-6)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=1e-6, rtol=1e-5)
