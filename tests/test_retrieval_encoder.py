"""Encoder parity: our JAX BERT + mean pooling vs transformers' PyTorch BertModel; length buckets,
micro-batches and the per-batch progress callback."""
import json

import numpy as np
import pytest

from retrieval.encoder import DenseEncoder, _length_buckets, _pick, resolve_config
from tests.assets import minilm_encoder_dir

TEXTS = [
    "who wrote the play hamlet",
    "Paris\nParis is the capital and most populous city of France, with an estimated population of 2,102,650.",
    "a",
    "The quick brown fox jumps over the lazy dog. " * 12,  # long enough to need the 128 bucket
    "Ünïcödé façade — naïve café, 東京 and numbers 3.14159 e=mc^2",
    "query: what year did the titanic sink?",
    "   leading and trailing spaces   ",
]


_WORDS = ("the cathedral was rebuilt after a fire in 1742 by the Duke of Wellington, whose engineers "
          "used local sandstone; its library holds 4,300 manuscripts on astronomy, maritime law and "
          "medieval chant, and the town of Tromsø lies on the line between Linz and Arequipa").split()


def _passage(k: int, words: int) -> str:
    """Wikipedia-lead-like text of about 1.3 * words MiniLM tokens (deterministic)."""
    body = " ".join(_WORDS[(k * 7 + j) % len(_WORDS)] for j in range(words))
    return f"Passage {k}\n{body.capitalize()}."


# 15 to ~300 tokens (the longest truncated at 256), shuffled so encode() has to sort them.
LONG = [_passage(k, w) for k, w in enumerate([150, 9, 120, 80, 101, 60, 230, 95, 30, 140, 110, 170, 88, 45, 125])]


@pytest.fixture(scope="module")
def encoder():
    return DenseEncoder.from_pretrained(minilm_encoder_dir())


@pytest.fixture(scope="module")
def small_batches():
    """Batches of 8 texts, forward calls of at most 256 padded tokens (so a batch splits)."""
    return DenseEncoder.from_pretrained(minilm_encoder_dir(), batch_size=8, max_batch_tokens=256)


def _spy_forward(monkeypatch, enc):
    """Record the [rows, length] shape of every forward call."""
    shapes, real = [], enc._forward

    def spy(state, ids, mask):
        shapes.append(tuple(ids.shape))
        return real(state, ids, mask)

    monkeypatch.setattr(enc, "_forward", spy)
    return shapes


@pytest.fixture(scope="module")
def torch_reference():
    torch = pytest.importorskip("torch")
    from transformers import AutoTokenizer, BertModel

    d = minilm_encoder_dir()
    tok = AutoTokenizer.from_pretrained(d)
    model = BertModel.from_pretrained(d).eval()

    def embed(texts, max_length=256):
        batch = tok(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        with torch.no_grad():
            h = model(**batch).last_hidden_state
        m = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()

    return embed


def _cos(a, b):
    return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_minilm_convention_is_sentence_transformers_mean_normalised():
    cfg = resolve_config(minilm_encoder_dir())
    assert cfg.convention == "sentence-transformers"
    assert (cfg.pooling, cfg.normalize, cfg.query_prefix, cfg.max_length) == ("mean", True, "", 256)


def test_e5_convention_sets_prefixes(tmp_path):
    d = tmp_path / "e5-base-v2"
    d.mkdir()
    cfg = resolve_config(str(d))
    assert (cfg.convention, cfg.query_prefix, cfg.passage_prefix, cfg.pooling, cfg.normalize) == (
        "e5", "query: ", "passage: ", "mean", True)
    with pytest.raises(ValueError, match="convention"):
        resolve_config(str(d), convention="bogus")


def test_parity_with_pytorch_padded_batch(encoder, torch_reference):
    ours = encoder.encode(TEXTS)
    ref = torch_reference(TEXTS)  # padded to the longest text in PyTorch too
    cos = _cos(ours, ref)
    assert ours.shape == (len(TEXTS), 384)
    assert cos.min() > 0.9999, f"cosine per text: {cos}"
    np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-5)


def test_parity_unpadded_single_texts(encoder, torch_reference):
    for text in TEXTS[:4]:
        ours = encoder.encode([text])
        ref = torch_reference([text])  # batch of one: no padding on the PyTorch side
        assert _cos(ours, ref)[0] > 0.9999, text


def test_padding_and_batch_composition_do_not_change_embeddings(encoder):
    alone = encoder.encode([TEXTS[0]])[0]
    in_batch = encoder.encode(TEXTS)[0]  # padded up to the long text's bucket, batch bucket 8
    assert _cos(alone, in_batch) > 0.99999


def test_truncation_at_max_length(encoder):
    long = "word " * 2000
    ids = encoder.tokenize([long])[0]
    assert len(ids) == 256
    assert encoder.encode([long]).shape == (1, 384)


def test_query_prefix_changes_the_embedding(tmp_path):
    enc = DenseEncoder.from_pretrained(minilm_encoder_dir(), query_prefix="query: ")
    q = enc.encode_queries(["capital of france"])[0]
    plain = enc.encode(["capital of france"])[0]
    prefixed = enc.encode(["query: capital of france"])[0]
    assert _cos(q, prefixed) > 0.99999 and _cos(q, plain) < 0.999


def test_warmup_compiles_the_shapes_queries_use_and_keeps_results(encoder, monkeypatch):
    before = encoder.encode(["capital of france"])
    shapes = _spy_forward(monkeypatch, encoder)
    n = encoder.warmup(max_tokens=32)
    warm = set(shapes)
    assert n == len(shapes) == len(warm) and {t for _, t in warm} == {16, 32}
    shapes.clear()
    queries = [f"who founded the {w} museum of {w}s in the year {1700 + i}" for i, w in enumerate(_WORDS)]
    for size in (1, 2, 3, 5, 8, 13, 21, 34, 55, 64):
        encoder.encode(queries[:size])
    assert shapes and max(t for _, t in shapes) == 32  # the long queries needed the 32 bucket
    assert set(shapes) <= warm, f"shapes warmup() did not compile: {set(shapes) - warm}"
    np.testing.assert_allclose(encoder.encode(["capital of france"]), before, atol=1e-6)


def test_length_buckets_are_multiples_of_16_then_32():
    assert _length_buckets(256) == list(range(16, 257, 16))
    assert _length_buckets(512) == list(range(16, 257, 16)) + list(range(288, 513, 32))
    assert _length_buckets(100) == [16, 32, 48, 64, 80, 96, 100]
    assert _pick(_length_buckets(256), 130) == 144  # was 256 with powers of two


def test_parity_with_pytorch_on_long_passages(encoder, torch_reference):
    lengths = [len(x) for x in encoder.tokenize(LONG)]
    assert min(lengths) < 20 and max(lengths) == 256 and sum(100 <= n <= 200 for n in lengths) >= 6
    ours = encoder.encode(LONG)
    ref = torch_reference(LONG)  # one padded batch on the PyTorch side
    cos = _cos(ours, ref)
    assert cos.min() > 0.9999, f"cosine per text: {cos}"


@pytest.mark.slow
def test_buckets_and_micro_batches_match_one_at_a_time(small_batches, monkeypatch):
    alone = np.concatenate([small_batches.encode([t]) for t in LONG])
    shapes = _spy_forward(monkeypatch, small_batches)
    together = small_batches.encode(LONG)
    np.testing.assert_allclose(together, alone, atol=2e-6)
    assert _cos(together, alone).min() > 0.99999
    # The run used finer-than-power-of-two lengths and kept every call within the token budget.
    lengths = {t for _, t in shapes}
    assert lengths - {16, 32, 64, 128, 256}, f"only power-of-two lengths: {sorted(lengths)}"
    assert all(b * t <= 256 or b == 1 for b, t in shapes), shapes
    assert sum(b for b, _ in shapes) < 2 * len(LONG)  # micro-batches hold several texts, not one each
    # No micro-batch pads a text by a whole bucket or more: each call's length is its longest text's bucket.
    ids = small_batches.tokenize(LONG)
    assert lengths <= {_pick(small_batches._len_buckets, len(x)) for x in ids}


def test_max_batch_tokens_zero_means_one_call_per_batch(monkeypatch):
    enc = DenseEncoder.from_pretrained(minilm_encoder_dir(), batch_size=8, max_batch_tokens=0)
    shapes = _spy_forward(monkeypatch, enc)
    enc.encode(LONG)  # 15 texts: batches of 8 and 7
    assert [b for b, _ in shapes] == [8, 8]
    with pytest.raises(ValueError, match="max_batch_tokens"):
        DenseEncoder.from_pretrained(minilm_encoder_dir(), max_batch_tokens=-1)


def test_progress_callback_once_per_batch_while_encoding(small_batches, monkeypatch):
    shapes = _spy_forward(monkeypatch, small_batches)
    calls = []
    texts = LONG + [t.upper() for t in LONG[:6]]  # 21 texts, batch_size 8
    out = small_batches.encode_passages(texts, callback=lambda n: calls.append((n, len(shapes))))
    assert out.shape == (21, 384)
    assert [n for n, _ in calls] == [8, 8, 5] and sum(n for n, _ in calls) == len(texts)
    # Called as each batch finishes, not all at the end: the forward calls grow between callbacks.
    seen = [k for _, k in calls]
    assert 0 < seen[0] < seen[1] < seen[2] == len(shapes)


def test_index_build_progress_reaches_corpus_size(small_batches, tmp_path, capsys, monkeypatch):
    import re

    import tqdm

    from retrieval.dense import build_dense_index
    from retrieval.index import read_manifest

    class EveryUpdate(tqdm.tqdm):  # draw every update, however fast the batches are
        def __init__(self, *a, **kw):
            super().__init__(*a, **{**kw, "mininterval": 0, "miniters": 1})

    monkeypatch.setattr(tqdm, "tqdm", EveryUpdate)
    passages = [{"id": f"p{i}", "contents": LONG[i % len(LONG)] + f" ({i})"} for i in range(37)]
    calls = []
    count = build_dense_index(iter(passages), small_batches, str(tmp_path / "idx"), chunk_size=20,
                              progress=True, callback=calls.append)
    assert count == 37 and read_manifest(str(tmp_path / "idx"))["count"] == 37
    assert calls == [8, 8, 4, 8, 8, 1]  # per encoder batch within chunks of 20 and 17, not per chunk
    frames = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    drawn = [int(m.group(1)) for f in frames for m in [re.search(r"index: (\d+)psg", f)] if m]
    assert drawn[-1] == 37 and {8, 16, 20, 28, 36} <= set(drawn), drawn  # the bar moved every batch
    assert "psg/s" in frames[-1], frames[-1]
    with open(tmp_path / "idx" / "manifest.json", encoding="utf-8") as f:
        assert "max_batch_tokens" not in json.load(f)["encoder"]  # a speed knob, not part of the index


def test_bfloat16_encoder_stays_close_to_float32(encoder):
    bf16 = DenseEncoder.from_pretrained(minilm_encoder_dir(), dtype="bfloat16")
    a, b = bf16.encode(TEXTS[:3]), encoder.encode(TEXTS[:3])
    assert a.dtype == np.float32 and _cos(a, b).min() > 0.99
