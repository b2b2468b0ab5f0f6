"""The KV-cache sampler against naive recomputation, transformers, and its own other paths."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.models import from_pretrained, make_mesh
from memsearcher_jax.sampling import BucketConfig, Sampler, filter_mask, find_stop, generate, normalize_stops
from memsearcher_jax.sampling.prefill_layout import layout_prefill
from tests.hf_fixtures import make_hf_qwen2
from tests.reference import full_logprobs, row_log_probs

VOCAB = 128


@pytest.fixture(scope="module")
def hf_and_model(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("qwen2_tiny"))
    hf = make_hf_qwen2(d, vocab_size=VOCAB)
    hf.model_dir = d
    return hf, from_pretrained(d)


def model_dir_of(hf_and_model) -> str:
    return hf_and_model[0].model_dir


@pytest.fixture(scope="module")
def sampler(hf_and_model):
    return Sampler(hf_and_model[1], cache_dtype=jnp.float32)


def _prompts(seed=0, lengths=(9, 3, 14, 1, 6)):
    rng = np.random.RandomState(seed)
    return [rng.randint(2, VOCAB, n).tolist() for n in lengths]


def _naive_greedy(model, prompt, n):
    """Recompute the full forward for every new token and take the argmax."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(row_log_probs(model, ids)[-1])))
    return ids[len(prompt):]


@pytest.mark.slow
def test_greedy_equals_naive_loop_and_transformers(hf_and_model, sampler):
    import torch

    hf, model = hf_and_model
    prompts = _prompts()
    n = 12
    outs = sampler.generate(prompts, max_new_tokens=n)
    for p, o in zip(prompts, outs):
        assert o.finish_reason == "length" and len(o.tokens) == n
        assert o.tokens == _naive_greedy(model, p, n)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
        assert o.tokens == ref[0, len(p):].tolist()
    # And as one left-padded ragged batch, the way an agent would call transformers.
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        batch_ref = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                pad_token_id=0)
    assert [o.tokens for o in outs] == batch_ref[:, width:].tolist()


def test_logprobs_equal_full_forward(hf_and_model, sampler):
    model = hf_and_model[1]
    prompts = _prompts(1)
    # Each token's log-prob under the distribution it was drawn from: logits / temperature (raw
    # when greedy), before the top-p cut: what the learner computes at the rollouts' temperature.
    for temp in (0.0, 1.3, 0.6):
        outs = sampler.generate(prompts, max_new_tokens=10, temperature=temp, top_p=0.9, seed=3)
        for p, o in zip(prompts, outs):
            ref = full_logprobs(model, p, o.tokens, temp if temp > 0 else 1.0)
            assert np.abs(np.asarray(o.logprobs) - ref).max() < 1e-4
            if temp > 0:  # the temperature-1 log-probs are another thing (the check has teeth)
                assert np.abs(np.asarray(o.logprobs) - full_logprobs(model, p, o.tokens)).max() > 1e-2


@pytest.mark.slow
def test_sampling_matches_intended_distribution(tmp_path):
    # A small vocabulary and large weights so the next-token distribution is far from uniform.
    make_hf_qwen2(str(tmp_path), vocab_size=16, std=1.0)
    model = from_pretrained(str(tmp_path))
    s = Sampler(model, cache_dtype=jnp.float32)
    prompt = [3, 7, 2]
    rows = 8192
    logits = model(jnp.asarray([prompt], jnp.int32))[0, -1]
    assert float(logits.max() - logits.min()) > 2.0  # precondition: a non-trivial distribution

    def check(temperature, top_p, top_k):
        scaled = logits / temperature
        keep = np.asarray(filter_mask(scaled[None], jnp.float32(top_p), jnp.int32(top_k)))[0]
        probs = np.where(keep, np.asarray(jax.nn.softmax(jnp.where(keep, scaled, -jnp.inf))), 0.0)
        outs = s.generate([prompt] * rows, max_new_tokens=1, temperature=temperature, top_p=top_p, top_k=top_k,
                          seed=11)
        first = np.array([o.tokens[0] for o in outs])
        freq = np.bincount(first, minlength=16) / rows
        assert not np.any(freq[~keep]), f"tokens outside the filter were sampled: {np.nonzero(freq * ~keep)}"
        # 4 standard errors of a frequency at 8192 draws is <= 0.022; a wrong temperature
        # or a missing renormalisation moves some frequency by far more on these logits.
        assert np.abs(freq - probs).max() < 0.025, (freq, probs)
        return keep, probs

    keep, probs = check(0.7, 0.95, 0)
    assert 1 < keep.sum() < 16
    # Without renormalisation (or with the temperature ignored) the kept tokens' probabilities
    # would be off by more than 4x the tolerance: the checks above have teeth.
    p1 = np.asarray(jax.nn.softmax(logits))
    assert np.abs(np.where(keep, np.asarray(jax.nn.softmax(logits / 0.7)), 0) - probs).max() > 0.1 or \
        np.abs(p1 - probs).max() > 0.1
    keep, _ = check(1.5, 1.0, 3)
    assert keep.sum() == 3
    keep, _ = check(1.3, 1.0, 0)
    assert keep.all()


def test_stop_ids_and_sequences_end_exactly_their_rows(sampler):
    prompts = _prompts(2, (5, 8, 2, 11))
    n = 14
    free = [o.tokens for o in sampler.generate(prompts, max_new_tokens=n)]
    stop_id = free[0][4]
    tool_call_end = tuple(free[1][6:8])  # stands for the tokens of "</tool_call>"
    stops = normalize_stops([stop_id], [tool_call_end])
    outs = sampler.generate(prompts, max_new_tokens=n, stop_token_ids=[stop_id], stop_sequences=[tool_call_end])
    ends = [find_stop(t, stops) for t in free]
    assert ends[0] is not None and ends[0] <= 5 and ends[1] is not None and ends[1] <= 8
    # Row 1 must end on the two-token sequence itself, not on the single stop id.
    if stop_id not in free[1][:8]:
        assert outs[1].tokens[-2:] == list(tool_call_end)
    assert any(e is None for e in ends), "want at least one row that runs to its budget"
    for f, e, o in zip(free, ends, outs):
        if e is None:
            assert o.finish_reason == "length" and o.tokens == f
        else:
            assert o.finish_reason == "stop" and o.tokens == f[:e]
            assert len(o.logprobs) == e


@pytest.mark.slow
def test_sharded_equals_single_device(hf_and_model, sampler):
    model = hf_and_model[1]
    prompts = _prompts(3, (7, 2, 12))
    prompts.append(prompts[0])  # a duplicate: the gathered prefill runs sharded too
    kw = dict(max_new_tokens=9, temperature=1.0, top_p=0.95, seed=5)
    ref = sampler.generate(prompts, **kw)
    for data, fsdp, tp in ((2, 2, 2), (1, 4, 2)):
        mesh = make_mesh(data, fsdp, tp)
        s = Sampler(model, cache_dtype=jnp.float32, mesh=mesh)
        outs = s.generate(prompts, **kw)
        for r, o in zip(ref, outs):
            assert o.tokens == r.tokens
            assert np.abs(np.asarray(o.logprobs) - np.asarray(r.logprobs)).max() < 1e-4
        # The weights are in the TP-only sampling layout: no weight is split over fsdp or data,
        # and the big matrices really are split over tp.
        specs = [leaf.sharding.spec for leaf in jax.tree.leaves(s._params)]
        assert all("fsdp" not in str(spec) and "data" not in str(spec) for spec in specs), specs
        layer = s._params["layers"][0]
        assert set(layer) >= {"qkv", "o", "gate_up", "down"}  # 2 KV heads split over tp=2: q/k/v fused
        for w in (layer["qkv"], layer["o"], layer["gate_up"], layer["down"], s._params["head"]):
            assert len(w.sharding.device_set) == 8 and "tp" in str(w.sharding.spec)
            assert w.addressable_shards[0].data.size * tp == w.size

    # A model placed in the training (FSDP) layout is re-laid out for sampling, not used as is.
    trained = from_pretrained(model_dir_of(hf_and_model), mesh=make_mesh(1, 4, 2))
    s = Sampler(trained, cache_dtype=jnp.float32, mesh=trained.mesh)
    assert all("fsdp" not in str(leaf.sharding.spec) for leaf in jax.tree.leaves(s._params))
    assert [o.tokens for o in s.generate(prompts, **kw)] == [r.tokens for r in ref]


@pytest.mark.slow
def test_query_heads_split_but_kv_heads_not_keeps_q_apart(tmp_path):
    # One KV head cannot be split over tp=2 while 4 query heads can: fusing q/k/v would
    # replicate the query weights, so the layout keeps q (split) and k/v (replicated) apart.
    make_hf_qwen2(str(tmp_path), vocab_size=VOCAB, num_key_value_heads=1)
    model = from_pretrained(str(tmp_path))
    prompts = _prompts(11, (7, 2, 12))
    kw = dict(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=5)
    ref = Sampler(model, cache_dtype=jnp.float32).generate(prompts, **kw)
    s = Sampler(model, cache_dtype=jnp.float32, mesh=make_mesh(2, 2, 2))
    layer = s._params["layers"][0]
    assert "qkv" not in layer and "tp" in str(layer["q"].sharding.spec) and "tp" not in str(layer["kv"].sharding.spec)
    for r, o in zip(ref, s.generate(prompts, **kw)):
        assert o.tokens == r.tokens
        assert np.abs(np.asarray(o.logprobs) - np.asarray(r.logprobs)).max() < 1e-4
    greedy = s.generate(prompts, max_new_tokens=6)
    assert [o.tokens for o in greedy] == [_naive_greedy(model, p, 6) for p in prompts]


def test_accelerator_forms_equal_the_cpu_forms(hf_and_model, sampler):
    # Off CPU the sampler takes the ordinary product forms (no weights-left decode products,
    # no row loop in prefill attention); force them here and compare with the CPU forms.
    model = hf_and_model[1]
    s = Sampler(model, cache_dtype=jnp.float32)
    s._math.weights_left = s._math.attention_by_row = False
    prompts = _prompts(13, (9, 3, 14))
    kw = dict(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=6)
    for a, b in zip(sampler.generate(prompts, **kw), s.generate(prompts, **kw)):
        assert a.tokens == b.tokens
        assert np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).max() < 1e-5
    assert sampler._math.weights_left and sampler._math.attention_by_row  # the fixture ran the CPU forms


def test_query_block_size_divides_the_queries():
    from memsearcher_jax.sampling.layers import query_block_size

    assert query_block_size(8192, 512) == 512
    assert query_block_size(256, 512) == 256 and query_block_size(256, 0) == 256
    assert query_block_size(96, 64) == 48  # the largest divisor that is not above the block
    assert query_block_size(97, 8) == 1


@pytest.mark.slow
def test_blocked_prefill_attention_equals_unblocked(hf_and_model):
    # Long prompts (64-slot suffix bucket) through prefill attention 8 queries at a time, on the
    # CPU row loop, on the accelerators' whole-batch form, and on a sharded mesh.
    model = hf_and_model[1]
    prompts = _prompts(21, (60, 33, 47, 5))
    kw = dict(max_new_tokens=6, temperature=1.0, top_p=0.95, seed=3)
    whole = Sampler(model, cache_dtype=jnp.float32, prefill_query_block=0)
    ref = whole.generate(prompts, **kw)
    for by_row in (True, False):
        s = Sampler(model, cache_dtype=jnp.float32, prefill_query_block=8)
        s._math.attention_by_row = by_row
        for a, b in zip(ref, s.generate(prompts, **kw)):
            assert a.tokens == b.tokens
            assert np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).max() < 1e-5
    sharded = Sampler(model, cache_dtype=jnp.float32, mesh=make_mesh(2, 2, 2), prefill_query_block=8)
    for a, b in zip(ref, sharded.generate(prompts, **kw)):
        assert a.tokens == b.tokens
        assert np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).max() < 1e-4
    assert [o.tokens for o in sharded.generate(prompts[:2], max_new_tokens=4)] == \
        [_naive_greedy(model, p, 4) for p in prompts[:2]]
    with pytest.raises(ValueError, match="prefill_query_block must be an integer >= 0"):
        Sampler(model, prefill_query_block=-1)


@pytest.mark.slow
def test_weight_copy_is_in_the_compute_dtype(hf_and_model):
    # f32 master weights computing in bf16: the sampler's copy is bf16 (half the bytes), and
    # rounding once at layout time is what the layer math would do at every use. (The dtype
    # assert is what guards the cast; the equality would hold with an f32 copy as well.)
    d = model_dir_of(hf_and_model)
    mixed = from_pretrained(d, dtype="bfloat16", param_dtype="float32")
    s = Sampler(mixed, cache_dtype=jnp.float32)
    assert {leaf.dtype for leaf in jax.tree.leaves(s._params)} == {jnp.dtype(jnp.bfloat16)}
    prompts = _prompts(22, (9, 4))
    kw = dict(max_new_tokens=6, temperature=1.0, seed=1)
    want = s.generate(prompts, **kw)
    # The same model stored in bf16 throughout samples the same tokens and log-probs.
    bf16 = from_pretrained(d, dtype="bfloat16", param_dtype="bfloat16")
    got = Sampler(bf16, cache_dtype=jnp.float32).generate(prompts, **kw)
    for a, b in zip(want, got):
        assert a.tokens == b.tokens and a.logprobs == b.logprobs


def test_duplicate_prompts_prefilled_once_equal_the_plain_path(hf_and_model):
    # A group's G samples start from one identical prompt: prefilled once, sampled per row.
    model = hf_and_model[1]
    s = Sampler(model, cache_dtype=jnp.float32, buckets=BucketConfig(min_shared_prefix=4))
    a, b = _prompts(9, (11, 6))
    sys_prompt = _prompts(10, (8,))[0]
    for prompts in ([a, a, b, a, b], [sys_prompt + a] * 3 + [sys_prompt + b] * 2):
        kw = dict(max_new_tokens=7, temperature=1.0, top_p=0.9, seed=2)
        shared = s.generate(prompts, **kw)
        lay = layout_prefill(prompts, s.buckets, 1, None, True, True)
        assert len(set(lay.reads[0][:len(prompts)].tolist())) == 2  # two distinct prompts: two grid rows read
        plain = s.generate(prompts, share_duplicates=False, **kw)
        for x, y in zip(shared, plain):
            assert x.tokens == y.tokens and x.finish_reason == y.finish_reason
            assert np.abs(np.asarray(x.logprobs) - np.asarray(y.logprobs)).max() < 1e-5
        # The rows of one prompt sampled independently (different keys), not copied.
        assert len({tuple(o.tokens) for o, p in zip(shared, prompts) if p == prompts[0]}) > 1


@pytest.mark.slow
def test_shared_prefix_equals_plain_path(hf_and_model):
    model = hf_and_model[1]
    s = Sampler(model, cache_dtype=jnp.float32, buckets=BucketConfig(min_shared_prefix=8))
    rng = np.random.RandomState(4)
    system = rng.randint(2, VOCAB, 40).tolist()
    prompts = [system + rng.randint(2, VOCAB, n).tolist() for n in (5, 1, 17, 9)]
    for kw in (dict(), dict(temperature=1.0, top_p=0.9, seed=2)):
        plain = s.generate(prompts, max_new_tokens=10, share_prefix=False, **kw)
        keys_before = set(s.compiled_keys)
        shared = s.generate(prompts, max_new_tokens=10, **kw)
        assert any(k[1] > 0 for k in s.compiled_keys - keys_before) or any(k[1] > 0 for k in keys_before)
        for a, b in zip(plain, shared):
            assert a.tokens == b.tokens
            assert np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).max() < 1e-4
    # On a mesh (rows over data x fsdp, KV heads over tp) the one-copy prefix is replicated
    # over the row shards and split over tp like the rows' own cache.
    sharded = Sampler(model, cache_dtype=jnp.float32, mesh=make_mesh(2, 2, 2),
                      buckets=BucketConfig(min_shared_prefix=8))
    kw = dict(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=2)
    before = set(sharded.compiled_keys)
    for a, b in zip(s.generate(prompts, **kw), sharded.generate(prompts, **kw)):
        assert a.tokens == b.tokens
        assert np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).max() < 1e-4
    assert any(k[1] > 0 for k in sharded.compiled_keys - before)  # the prefix really was split off
    # A whole group of identical prompts: everything but the last token is shared.
    group = s.generate([prompts[2]] * 4, max_new_tokens=6)
    alone = s.generate([prompts[2]], max_new_tokens=6)
    assert all(g.tokens == alone[0].tokens for g in group)
    assert _naive_greedy(model, prompts[2], 6) == alone[0].tokens


@pytest.mark.slow
def test_capped_shared_prefix_equals_plain_path(hf_and_model):
    # The turn loop's buckets split off at most max_shared_prefix tokens, a lone prompt's too, so
    # every call's prefix takes one shape; the tokens must not change.
    model = hf_and_model[1]
    bk = BucketConfig(min_shared_prefix=8, max_shared_prefix=16, batch_growth=4, prompt_growth=4)
    s = Sampler(model, cache_dtype=jnp.float32, buckets=bk)
    rng = np.random.RandomState(5)
    system = rng.randint(2, VOCAB, 30).tolist()  # longer than the cap: the rest stays in the suffixes
    prompts = [system + rng.randint(2, VOCAB, n).tolist() for n in (5, 1, 17)]
    for batch in (prompts, prompts[2:]):  # several prompts, and a lone one
        kw = dict(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)
        keys_before = set(s.compiled_keys)
        capped = s.generate(batch, **kw)
        new = s.compiled_keys - keys_before
        assert not new or {k[1] for k in new} == {16}  # the prefix slot: the cap, lone prompt included
        plain = s.generate(batch, share_prefix=False, **kw)
        for a, b in zip(capped, plain):
            assert a.tokens == b.tokens
            assert np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).max() < 1e-4
    assert {k[1] for k in s.compiled_keys} == {0, 16}
    assert layout_prefill(prompts[2:], bk, 1, None, True, True).prefix_slots == 16  # the lone prompt split too
    assert _naive_greedy(model, prompts[2], 6) == s.generate([prompts[2]], max_new_tokens=6)[0].tokens


@pytest.mark.slow
def test_packed_prefill_equals_one_row_per_prompt(hf_and_model):
    # Short suffixes share rows of the prefill grid; each must see only the prefix and itself.
    model = hf_and_model[1]
    s = Sampler(model, cache_dtype=jnp.float32, buckets=BucketConfig(min_shared_prefix=8))
    rng = np.random.RandomState(12)
    system = rng.randint(2, VOCAB, 20).tolist()
    tails = [rng.randint(2, VOCAB, n).tolist() for n in (3, 30, 1, 12, 7, 2, 16, 5)]
    for prompts in ([system + t for t in tails], tails, [system + t for t in tails] + [system + tails[0]]):
        kw = dict(max_new_tokens=9, temperature=1.0, top_p=0.9, seed=4)
        packed = s.generate(prompts, **kw)
        plain = s.generate(prompts, pack=False, **kw)
        for a, b in zip(packed, plain):
            assert a.tokens == b.tokens and a.finish_reason == b.finish_reason
            assert np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).max() < 1e-5
        lay = layout_prefill(prompts, s.buckets, 1, None, True, True)
        assert len(set(lay.reads[0][:len(prompts)].tolist())) < len(prompts)  # packing really happened
    # Every prefill the sampler ran (packed or not): the grid has the batch's rows, no program of its own.
    assert s.compiled_keys and all(k[-1] == k[0] for k in s.compiled_keys)
    greedy = s.generate(tails, max_new_tokens=5)
    assert [o.tokens for o in greedy] == [_naive_greedy(model, t, 5) for t in tails]


@pytest.mark.slow
def test_seed_reproducible_and_compilations_bounded(hf_and_model):
    model = hf_and_model[1]
    s = Sampler(model, cache_dtype=jnp.float32, buckets=BucketConfig(min_batch=4, min_prompt=16, min_new_tokens=8))
    prompts = _prompts(5, (4, 9, 2))
    a = s.generate(prompts, max_new_tokens=8, temperature=1.0, seed=7)
    b = s.generate(prompts, max_new_tokens=8, temperature=1.0, seed=7)
    c = s.generate(prompts, max_new_tokens=8, temperature=1.0, seed=8)
    assert [o.tokens for o in a] == [o.tokens for o in b]
    assert [o.tokens for o in a] != [o.tokens for o in c]
    assert s.num_compilations == 2  # one prefill + one decode program
    rng = np.random.RandomState(0)
    for i in range(12):  # batch 1..4, prompts 1..16 tokens, budgets 1..8, all settings: one bucket
        ps = [rng.randint(2, VOCAB, rng.randint(1, 17)).tolist() for _ in range(rng.randint(1, 5))]
        s.generate(ps, max_new_tokens=int(rng.randint(1, 9)), temperature=float(i % 2), top_p=0.9 if i % 3 else 1.0,
                   top_k=i % 4, stop_token_ids=[i], seed=i)
    assert s.num_compilations == 2
    s.generate(_prompts(6, (30,)), max_new_tokens=20)  # next prompt and budget buckets
    assert s.num_compilations == 4


def test_update_params_changes_outputs_without_recompiling(tmp_path, hf_and_model, sampler):
    model = hf_and_model[1]
    prompts = _prompts(7, (6, 3))
    before = sampler.generate(prompts, max_new_tokens=8)
    n = sampler.num_compilations
    make_hf_qwen2(str(tmp_path), vocab_size=VOCAB, seed=1)
    other = from_pretrained(str(tmp_path))
    sampler.update_params(other)
    after = sampler.generate(prompts, max_new_tokens=8)
    assert sampler.num_compilations == n
    assert [o.tokens for o in after] == [_naive_greedy(other, p, 8) for p in prompts]
    assert [o.tokens for o in after] != [o.tokens for o in before]
    sampler.update_params(model)
    assert [o.tokens for o in sampler.generate(prompts, max_new_tokens=8)] == [o.tokens for o in before]
    make_hf_qwen2(str(tmp_path / "wide"), vocab_size=VOCAB, hidden_size=32)
    with pytest.raises(ValueError, match="different ModelConfig"):
        sampler.update_params(from_pretrained(str(tmp_path / "wide")))


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompts=[]), "non-empty list"),
    (dict(prompts=[[1, 2], []]), "prompt 1 is empty"),
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(prompts=[[3] * 500]), "max_len 512"),
    (dict(top_p=0.0), "top_p must be in"),
    (dict(top_p=1.5), "top_p must be in"),
    (dict(temperature=-0.1), "temperature must be >= 0"),
    (dict(top_k=-1), "top_k must be an integer"),
    (dict(prompts=[[VOCAB]]), "outside \\[0, 128\\)"),
    (dict(stop_token_ids=[-3]), "stop \\[-3\\]"),
])
def test_bad_input_fails_before_compiling(hf_and_model, kwargs, match):
    s = Sampler(hf_and_model[1], cache_dtype=jnp.float32)
    args = dict(prompts=[[5, 6]], max_new_tokens=16)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        s.generate(args.pop("prompts"), **args)
    assert s.num_compilations == 0


def test_generate_function_validates_before_building_a_sampler(hf_and_model, monkeypatch):
    import memsearcher_jax.sampling.sampler as sampler_module

    built = []
    monkeypatch.setattr(sampler_module.Sampler, "__init__", lambda self, *a, **k: built.append(1))
    for bad in (dict(prompts=[]), dict(prompts=[[]]), dict(prompts=[[1]], top_p=2.0)):
        args = dict(prompts=[[5, 6]], max_new_tokens=4) | bad
        with pytest.raises(ValueError):
            generate(hf_and_model[1], args.pop("prompts"), **args)
    assert not built


def test_generate_function_and_bf16_cache(hf_and_model):
    model = hf_and_model[1]
    prompts = _prompts(8, (5, 2))
    outs = generate(model, prompts, max_new_tokens=6)  # default bf16 cache
    ref = [_naive_greedy(model, p, 6) for p in prompts]
    # bf16 keys/values perturb logits slightly; the first token (prompt K/V only) must agree.
    assert [o.tokens[0] for o in outs] == [r[0] for r in ref]
    assert all(len(o.tokens) == 6 and o.finish_reason == "length" for o in outs)


def test_one_shot_generate_compiles_once_and_follows_new_weights(hf_and_model):
    from memsearcher_jax.sampling.sampler import cached_sampler

    model = hf_and_model[1]
    prompts, kw = _prompts(7), dict(max_new_tokens=5, temperature=0.0)
    first = generate(model, prompts, **kw)
    compiled = cached_sampler(model).num_compilations
    assert compiled >= 2
    assert [c.tokens for c in generate(model, prompts, **kw)] == [c.tokens for c in first]
    assert cached_sampler(model).num_compilations == compiled  # the second identical call compiled nothing
    # A model of the same architecture with other weights: same programs, its own tokens.
    other = nnx.clone(model)
    other.embed[...] = other.embed[...] * -1.0
    got = generate(other, prompts, **kw)
    assert cached_sampler(other).num_compilations == compiled
    assert [c.tokens for c in got] == [_naive_greedy(other, p, 5) for p in prompts]


def test_one_shot_generate_skips_the_weight_copy_only_when_the_weights_are_unchanged(hf_and_model):
    from memsearcher_jax.sampling.sampler import cached_sampler

    model = nnx.clone(hf_and_model[1])
    prompts, kw = _prompts(5), dict(max_new_tokens=4, temperature=0.0)
    generate(model, prompts, **kw)
    laid_out = cached_sampler(model)._params
    generate(model, prompts, **kw)
    assert cached_sampler(model)._params is laid_out  # same arrays: no new layout copy
    # An in-place edit of the same model object gives new arrays: the copy is redone and followed.
    model.embed[...] = model.embed[...] * -1.0
    got = generate(model, prompts, **kw)
    assert cached_sampler(model)._params is not laid_out
    assert [c.tokens for c in got] == [_naive_greedy(model, p, 4) for p in prompts]


def test_generate_defaults_keep_float32_logprobs_exact(tmp_path):
    """A float32 model with odd head counts: generate's defaults (cache in the model's dtype)
    give each token's log-prob within 1e-4 of the full forward's log_softmax."""
    d = str(tmp_path / "odd")
    make_hf_qwen2(d, vocab_size=517, hidden_size=96, num_attention_heads=6, num_key_value_heads=2,
                  intermediate_size=80)
    model = from_pretrained(d)
    assert model.config.head_dim == 16
    prompts = _prompts(3, lengths=(11, 4, 17))
    outs = generate(model, prompts, max_new_tokens=12, temperature=1.0, seed=2)
    worst = 0.0
    for p, o in zip(prompts, outs):
        worst = max(worst, float(np.abs(full_logprobs(model, p, o.tokens) - np.asarray(o.logprobs)).max()))
    assert worst < 1e-4, worst
