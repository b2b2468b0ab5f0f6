"""Pure helpers of the sampler: buckets, stop tables, token filtering."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memsearcher_jax.sampling import (
    BucketConfig,
    bucket,
    common_prefix_length,
    filter_mask,
    find_stop,
    normalize_stops,
    pack_stops,
    push_window,
    sample_from_logits,
    stop_hits,
    token_logprobs,
)
from memsearcher_jax.sampling.prefill_layout import layout_prefill, pack_suffixes
from memsearcher_jax.sampling.stopping import NO_TOKEN


def test_bucket_powers_of_two_and_steps():
    assert [bucket(n, 16) for n in (0, 1, 16, 17, 33, 100)] == [16, 16, 16, 32, 64, 128]
    assert [bucket(n, 16, 2) for n in (17, 24, 25, 33, 300, 500)] == [24, 24, 32, 48, 384, 512]
    assert bucket(5, 1, 1, multiple_of=4) == 8 and bucket(3, 1, 1, multiple_of=6) == 6
    for n in range(1, 2000):
        b = bucket(n, 8, 2)
        assert n <= b <= max(8, int(np.ceil(n * 1.5)))
    with pytest.raises(ValueError, match="minimum"):
        bucket(3, 0)
    with pytest.raises(ValueError, match="BucketConfig.min_batch"):
        BucketConfig(min_batch=0)


def test_bucket_count_is_bounded():
    cfg = BucketConfig(min_prompt=16, prompt_steps_per_octave=2)
    sizes = {cfg.prompt(n) for n in range(1, 4097)}
    assert len(sizes) == 2 * 8 + 1  # 16, 24, 32, 48, ..., 3072, 4096
    assert {cfg.new_tokens(n) for n in range(1, 513)} == {16, 32, 64, 128, 256, 512}


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[1, 2, 3]]) == 3
    assert common_prefix_length([[5], [1, 2]]) == 0


def test_stop_table_and_hits():
    stops = normalize_stops([7, 7], [[3, 4, 5], [9, 8]])
    assert stops == [(7,), (3, 4, 5), (9, 8)]
    table, lengths = pack_stops(stops)
    assert table.shape == (4, 4) and lengths.tolist() == [1, 3, 2, 0]
    windows = np.array([
        [NO_TOKEN, 1, 2, 7],   # ends with 7
        [1, 3, 4, 5],          # ends with 3 4 5
        [NO_TOKEN, NO_TOKEN, 4, 5],  # only the tail of 3 4 5: no
        [1, 9, 8, 2],          # 9 8 not at the end: no
        [0, 0, 9, 8],          # ends with 9 8
        [0, 0, 0, 0],          # the unused table row (length 0) must not match
    ], np.int32)
    hits = np.asarray(stop_hits(jnp.asarray(windows), jnp.asarray(table), jnp.asarray(lengths)))
    assert hits.tolist() == [True, True, False, False, True, False]
    with pytest.raises(ValueError, match="empty sequence"):
        normalize_stops([], [[]])


def test_push_window_only_active_rows():
    w = jnp.asarray([[1, 2, 3], [4, 5, 6]], jnp.int32)
    out = push_window(w, jnp.asarray([9, 9]), jnp.asarray([True, False]))
    assert np.asarray(out).tolist() == [[2, 3, 9], [4, 5, 6]]


def test_find_stop_reference():
    stops = [(5,), (1, 2)]
    assert find_stop([0, 1, 2, 5], stops) == 3
    assert find_stop([0, 5, 1, 2], stops) == 2
    assert find_stop([0, 1, 3], stops) is None


def test_filter_mask_top_p_top_k():
    logits = jnp.log(jnp.asarray([[0.5, 0.2, 0.15, 0.1, 0.05]], jnp.float32))
    keep = lambda p, k: np.asarray(filter_mask(logits, jnp.float32(p), jnp.int32(k)))[0].tolist()
    assert keep(1.0, 0) == [True] * 5
    assert keep(0.5, 0) == [True, False, False, False, False]   # 0.5 reaches 0.5
    assert keep(0.6, 0) == [True, True, False, False, False]
    assert keep(0.86, 0) == [True, True, True, True, False]     # 0.85 < 0.86
    assert keep(1.0, 2) == [True, True, False, False, False]
    # top-p is measured on the top-k renormalised distribution: 0.5/0.85 < 0.6 -> two kept
    assert keep(0.6, 3) == [True, True, False, False, False]
    assert keep(1e-6, 0) == [True, False, False, False, False]


def test_sample_from_logits_greedy_and_support():
    logits = jnp.asarray([[0.0, 3.0, 1.0, 2.0]] * 256, jnp.float32)
    u = jax.random.uniform(jax.random.key(0), (256,))
    greedy = sample_from_logits(logits, u, jnp.float32(0.0), jnp.float32(1.0), jnp.int32(0))
    assert set(np.asarray(greedy).tolist()) == {1}
    topk = sample_from_logits(logits, u, jnp.float32(1.0), jnp.float32(1.0), jnp.int32(2))
    assert set(np.asarray(topk).tolist()) == {1, 3}
    full = sample_from_logits(logits, u, jnp.float32(1.0), jnp.float32(1.0), jnp.int32(0))
    assert set(np.asarray(full).tolist()) == {0, 1, 2, 3}
    lp = token_logprobs(logits[:1], jnp.asarray([3]))
    assert abs(float(lp[0]) - float(jax.nn.log_softmax(logits[0])[3])) < 1e-6


def _reference_mask(x: np.ndarray, top_p: float, top_k: int) -> np.ndarray:
    """Sort-based top-k then top-p (smallest prefix of the sorted order reaching top_p)."""
    order = np.argsort(-x, kind="stable")
    k = top_k if top_k > 0 else len(x)
    kept = order[:k]
    p = np.exp(x[kept] - x[kept].max())
    p /= p.sum()
    before = np.cumsum(p) - p
    n = max(1, int(np.sum(before < top_p))) if top_p < 1 else k
    return x >= x[kept[n - 1]]


def test_bisection_filter_equals_sort_reference():
    rng = np.random.RandomState(0)
    x = (rng.randn(64, 500) * rng.choice([0.3, 1.0, 4.0], (64, 1))).astype(np.float32)
    for top_p, top_k in ((0.9, 0), (0.5, 0), (0.99, 0), (1.0, 7), (0.8, 40), (0.3, 1)):
        ours = np.asarray(filter_mask(jnp.asarray(x), jnp.float32(top_p), jnp.int32(top_k)))
        ref = np.stack([_reference_mask(row, top_p, top_k) for row in x])
        assert (ours == ref).all(), (top_p, top_k, np.nonzero((ours != ref).any(-1)))


def test_project_both_forms_equal_the_plain_contraction():
    from memsearcher_jax.sampling.layers import project

    rng = np.random.RandomState(0)
    x = jnp.asarray(rng.randn(3, 1, 4, 5), jnp.float32)  # [B, T, H, Dh]
    w = jnp.asarray(rng.randn(2, 6, 4, 5), jnp.float32)  # [out..., H, Dh]
    want = np.einsum("bthd,oihd->btoi", np.asarray(x), np.asarray(w))
    for weights_left in (False, True):
        got = jax.jit(lambda x, w: project(x, w, 2, weights_left))(x, w)
        assert got.shape == (3, 1, 2, 6)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="does not take inputs"):
        project(x, w[..., :4], 2, False)


def test_pack_suffixes_first_fit_decreasing():
    lengths = [5, 9, 3, 8, 2, 7, 1]
    places, rows = pack_suffixes(lengths, 10)
    assert rows == 4  # 35 tokens in rows of 10: [9, 1], [8, 2], [7, 3], [5]
    taken = set()
    for n, (r, c) in zip(lengths, places):
        assert 0 <= r < rows and 0 <= c and c + n <= 10
        cells = {(r, c + i) for i in range(n)}
        assert not cells & taken
        taken |= cells
    assert places[1] == (0, 0) and places[6] == (0, 9)  # the longest first, the shortest fills its gap
    assert pack_suffixes(lengths, 10, pack=False) == ([(i, 10 - n) for i, n in enumerate(lengths)], 7)
    assert pack_suffixes([4, 4, 4], 4) == ([(0, 0), (1, 0), (2, 0)], 3)
    with pytest.raises(ValueError, match="suffix 1 has 11 tokens"):
        pack_suffixes([3, 11], 10)



def test_layout_prefill_reads_every_prompt_back_from_the_grid():
    """Each row's suffix, read from the packed grid at (rows, cols), is its prompt past the shared
    prefix, left-padded; positions continue after the prefix; identical suffixes share a place."""
    prefix = list(range(100, 140))  # 40 shared tokens
    tails = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [1, 2, 3], [11]]
    prompts = [prefix + t for t in tails]
    bk = BucketConfig(min_batch=1, min_prompt=8, min_shared_prefix=32)
    lay = layout_prefill(prompts, bk, batch_shards=1, share_prefix=None, share_duplicates=True, pack=True)
    (p_ids, p_pos, p_valid), (ids, pos, seg), (rows, cols, next_pos) = lay.prefix, lay.grid, lay.reads
    assert p_ids.shape == (1, lay.prefix_slots) and lay.prefix_slots >= 40
    assert p_ids[0, p_valid[0]].tolist() == prefix and p_pos[0, p_valid[0]].tolist() == list(range(40))
    assert lay.batch >= 4 and ids.shape == (lay.grid_rows, lay.suffix_slots) and lay.suffix_slots >= 7
    assert sorted(set(seg[seg >= 0].tolist())) == [0, 1, 2]  # the duplicate [1, 2, 3] is prefilled once
    for j, tail in enumerate(tails):
        read = cols[j][cols[j] >= 0]
        assert ids[rows[j], read].tolist() == tail
        assert pos[rows[j], read].tolist() == list(range(40, 40 + len(tail))) and next_pos[j] == 40 + len(tail)
        assert (cols[j][:lay.suffix_slots - len(tail)] == -1).all()  # left-padded
    assert rows[0] == rows[2] and (cols[0] == cols[2]).all()
    alone = layout_prefill(prompts, bk, batch_shards=1, share_prefix=False, share_duplicates=False, pack=False)
    assert alone.prefix_slots == 0 and alone.grid[0].shape[0] >= 4  # one grid row per prompt, whole prompts
    assert alone.grid[0][alone.reads[0][1], alone.reads[1][1][alone.reads[1][1] >= 0]].tolist() == prompts[1]

def test_first_max_index_is_argmax_with_first_index_on_ties():
    from memsearcher_jax.sampling.distributions import first_max_index

    rng = np.random.RandomState(1)
    x = rng.randn(6, 1001).astype(np.float32)
    x[1, [7, 500, 900]] = 9.0  # ties: the first wins
    x[2, -1] = 9.0
    x[3, :] = -2.0  # all equal
    got = np.asarray(jax.jit(first_max_index)(jnp.asarray(x)))
    assert got.tolist() == np.argmax(x, axis=-1).tolist() and got[1] == 7 and got[3] == 0


@pytest.mark.parametrize("v, block", [(1000, 64), (1024, 64), (37, 1024), (151936, 1024)])
def test_inverse_cdf_is_the_first_index_past_the_target(v, block):
    from memsearcher_jax.sampling.distributions import _block_size, inverse_cdf

    rng = np.random.RandomState(v)
    b = 64
    w = rng.exponential(size=(b, v)).astype(np.float32)
    w[rng.rand(b, v) < 0.3] = 0.0  # filtered-out tokens weigh 0
    w[0] = 0.0
    w[0, v // 2] = 1.0  # one token only
    u = rng.rand(b).astype(np.float32)
    u[1], u[2] = 0.0, np.nextafter(np.float32(1), np.float32(0))
    got = np.asarray(jax.jit(lambda w, u: inverse_cdf(w, u, block))(jnp.asarray(w), jnp.asarray(u)))
    cdf = np.cumsum(w.astype(np.float64), axis=-1)
    want = np.array([np.searchsorted(cdf[i], u[i] * cdf[i, -1], side="right") for i in range(b)])
    # float32 running sums may round a target that sits within ~1e-6 of a boundary either way
    close = np.abs(cdf[np.arange(b), np.minimum(want, v - 1)] - u * cdf[:, -1]) < 1e-5 * cdf[:, -1]
    assert np.all((got == want) | close), (got[got != want], want[got != want])
    assert got[0] == v // 2 and got[1] == np.flatnonzero(w[1])[0]
    chosen = got[got >= 0]
    assert np.all(w[np.arange(b)[got >= 0], chosen] > 0)  # never a zero-weight token
    assert _block_size(151936, 1024) == 128 and _block_size(1000, 64) == 64 and _block_size(37, 1024) == 37


def test_prefill_attention_row_loop_equals_all_rows_at_once():
    from memsearcher_jax.sampling.layers import cached_attention

    rng = np.random.RandomState(2)
    b, t, s, kh, g, d = 3, 5, 9, 2, 3, 8
    q = jnp.asarray(rng.randn(b, t, kh * g, d), jnp.float32)
    k, v = (jnp.asarray(rng.randn(b, kh, s, d), jnp.float32) for _ in range(2))
    mask = jnp.asarray(rng.rand(b, t, s) < 0.7).at[:, :, 0].set(True)
    want = jax.jit(lambda *a: cached_attention(*a, by_row=False))(q, k, v, mask)
    got = jax.jit(lambda *a: cached_attention(*a, by_row=True))(q, k, v, mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    # and both are softmax(q k^T / sqrt(d)) v per head over the unmasked slots
    qn, kn, vn, mn = map(np.asarray, (q, k, v, mask))
    heads = np.arange(kh * g) // g
    sc = np.einsum("bthd,bhsd->bths", qn, kn[:, heads]) / np.sqrt(d)
    sc = np.where(mn[:, :, None], sc, -np.inf)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(got), np.einsum("bths,bhsd->bthd", p, vn[:, heads]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("top_p, top_k, peaked, path", [
    (0.9, 0, True, "fast"), (0.5, 30, True, "fast"), (1.0, 10, False, "fast"), (0.99, 256, True, "fast"),
    (0.9, 0, False, "bisection"),   # a flat row: the nucleus is wider than the 256 candidates
    (1.0, 300, True, "bisection"),  # k beyond the candidates
])
def test_candidate_fast_path_equals_the_sort_reference(top_p, top_k, peaked, path, monkeypatch):
    from memsearcher_jax.sampling import distributions

    rng = np.random.RandomState(1)
    scale = 6.0 if peaked else 0.05
    x = (rng.randn(16, 1000) * scale).astype(np.float32)
    ref = np.stack([_reference_mask(row, top_p, top_k) for row in x])
    assert (np.asarray(filter_mask(jnp.asarray(x), jnp.float32(top_p), jnp.int32(top_k))) == ref).all()
    # Which path ran: with the bisection replaced by "keep nothing", only the fast path is right.
    monkeypatch.setattr(distributions, "_bisect_mask", lambda s, *a: jnp.zeros(s.shape, bool))
    got = np.asarray(filter_mask(jnp.asarray(x), jnp.float32(top_p), jnp.int32(top_k)))
    assert (got == ref).all() == (path == "fast")


def test_fast_path_edge_cases_equal_the_sort_reference():
    rng = np.random.RandomState(2)
    v = 1000
    # The k-th largest logit tied with many more beyond the 256 candidates (ties are kept).
    tied = np.full((4, v), -5.0, np.float32)
    tied[:, :10] = rng.randn(4, 10) + 10
    tied[:, 10:400] = 1.0  # 390 tokens share one logit
    # top_k beyond the vocabulary (means "all") with a top-p cut.
    peaked = (rng.randn(4, v) * 6).astype(np.float32)
    for x, top_p, top_k in ((tied, 1.0, 20), (tied, 0.999, 0), (peaked, 0.9, 5000), (peaked, 0.7, v)):
        ours = np.asarray(filter_mask(jnp.asarray(x), jnp.float32(top_p), jnp.int32(top_k)))
        ref = np.stack([_reference_mask(row, top_p, top_k) for row in x])
        assert (ours == ref).all(), (top_p, top_k)
        bisect_only = np.asarray(filter_mask(jnp.asarray(x), jnp.float32(top_p), jnp.int32(top_k), candidates=0))
        assert (bisect_only == ref).all(), (top_p, top_k)
    assert np.asarray(filter_mask(jnp.asarray(tied), jnp.float32(1.0), jnp.int32(20)))[:, :400].all()


def test_prefixed_decode_attention_equals_attention_over_the_concatenated_cache():
    from memsearcher_jax.sampling.layers import cached_attention, prefixed_decode_attention

    rng = np.random.RandomState(3)
    b, h, kh, d, p, s = 3, 4, 2, 8, 5, 7
    q = jnp.asarray(rng.randn(b, 1, h, d), jnp.float32)
    pk, pv = (jnp.asarray(rng.randn(1, kh, p, d), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.randn(b, kh, s, d), jnp.float32) for _ in range(2))
    prefix_valid = jnp.asarray([[False, True, True, True, True]])  # left padding in the prefix bucket
    mask = jnp.asarray(rng.rand(b, 1, s) < 0.7).at[:, :, 0].set(True)
    got = prefixed_decode_attention(q, pk, pv, prefix_valid, k, v, mask)
    full_k = jnp.concatenate([jnp.broadcast_to(pk, (b, kh, p, d)), k], axis=2)
    full_v = jnp.concatenate([jnp.broadcast_to(pv, (b, kh, p, d)), v], axis=2)
    full_mask = jnp.concatenate([jnp.broadcast_to(prefix_valid[:, None], (b, 1, p)), mask], axis=2)
    want = cached_attention(q, full_k, full_v, full_mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
