"""Encoder parity: our JAX BERT + mean pooling vs transformers' PyTorch BertModel."""
import numpy as np
import pytest

from memsearcher_jax.assets import minilm_encoder_dir
from retrieval.encoder import DenseEncoder, resolve_config

TEXTS = [
    "who wrote the play hamlet",
    "Paris\nParis is the capital and most populous city of France, with an estimated population of 2,102,650.",
    "a",
    "The quick brown fox jumps over the lazy dog. " * 12,  # long enough to need the 128 bucket
    "Ünïcödé façade — naïve café, 東京 and numbers 3.14159 e=mc^2",
    "query: what year did the titanic sink?",
    "   leading and trailing spaces   ",
]


@pytest.fixture(scope="module")
def encoder():
    return DenseEncoder.from_pretrained(minilm_encoder_dir())


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


def test_warmup_compiles_query_shapes_and_keeps_results(encoder):
    before = encoder.encode(["capital of france"])
    n = encoder.warmup(max_tokens=32)
    assert n == 2 * 7  # length buckets 16, 32 x batch buckets 1..64
    np.testing.assert_allclose(encoder.encode(["capital of france"]), before, atol=1e-6)


def test_bfloat16_encoder_stays_close_to_float32(encoder):
    bf16 = DenseEncoder.from_pretrained(minilm_encoder_dir(), dtype="bfloat16")
    a, b = bf16.encode(TEXTS[:3]), encoder.encode(TEXTS[:3])
    assert a.dtype == np.float32 and _cos(a, b).min() > 0.99
