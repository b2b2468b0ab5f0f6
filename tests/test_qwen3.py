"""Qwen3 (dense): the JAX module, the sampler and HF import/export against transformers' Qwen3ForCausalLM."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.models import ModelConfig, Qwen2, from_pretrained, make_mesh, param_dict, save_pretrained
from memsearcher_jax.models.hf_io import expected_hf_keys
from memsearcher_jax.models.safetensors_io import TensorDirectory
from memsearcher_jax.models.sharding import PARAM_SPEC_FIELD
from memsearcher_jax.sampling import Sampler
from tests.hf_fixtures import make_hf_qwen3, torch_logits
from tests.reference import forward, full_logprobs

VOCAB = 128
# GQA 6 query / 2 KV heads, head_dim 16 apart from hidden / heads (48 / 6 = 8), untied, eps 1e-5.
ODD = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
           num_key_value_heads=2, head_dim=16, tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=1e4)


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("qwen3_odd"))
    hf = make_hf_qwen3(d, **ODD)
    return d, hf, from_pretrained(d)


def test_config_reads_qwen3_and_has_the_right_params(odd):
    d, _, model = odd
    cfg = model.config
    assert cfg.model_type == "qwen3" and cfg.qk_norm and not cfg.attention_bias
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size) == (6, 2, 16, 48)
    assert cfg.rms_norm_eps == 1e-5 and not cfg.tie_word_embeddings
    params = param_dict(model)
    assert params["layers.q_norm"].shape == params["layers.k_norm"].shape == (3, 16)
    assert not any(n.endswith("_bias") for n in params)
    assert set(params) <= set(PARAM_SPEC_FIELD)
    assert sum(int(np.prod(a.shape)) for a in params.values()) == cfg.num_params()
    keys = expected_hf_keys(cfg)
    assert "model.layers.2.self_attn.k_norm.weight" in keys and "model.layers.0.self_attn.q_proj.bias" not in keys
    # Qwen2 keeps its biases and has no q/k norms.
    q2 = Qwen2(ModelConfig.tiny(), rngs=nnx.Rngs(0))
    names = set(param_dict(q2))
    assert {"layers.q_bias", "layers.k_bias", "layers.v_bias"} <= names and "layers.q_norm" not in names
    assert sum(int(np.prod(a.shape)) for a in param_dict(q2).values()) == q2.config.num_params()


def test_logit_parity_with_transformers(odd):
    _, hf, model = odd
    rng = np.random.RandomState(1)
    ids = rng.randint(0, VOCAB, (3, 13))
    ours = np.asarray(forward(model, jnp.asarray(ids, jnp.int32)))
    ref = torch_logits(hf, ids)
    assert ours.shape == (3, 13, VOCAB)
    assert np.abs(ours - ref).max() < 1e-4
    # Left-padded ragged rows.
    rows = [rng.randint(2, VOCAB, n) for n in (13, 7, 1)]
    t = max(map(len, rows))
    pids = np.zeros((3, t), np.int64)
    pmask = np.zeros((3, t), np.int64)
    for i, r in enumerate(rows):
        pids[i, t - len(r):], pmask[i, t - len(r):] = r, 1
    ours_p = np.asarray(forward(model, jnp.asarray(pids, jnp.int32), attention_mask=jnp.asarray(pmask)))
    ref_p = torch_logits(hf, pids, pmask)
    real = pmask.astype(bool)
    assert np.isfinite(ours_p).all() and np.abs(ours_p[real] - ref_p[real]).max() < 1e-4
    # scan_layers gives the same network.
    scanned = from_pretrained(odd[0], scan_layers=True)
    assert np.abs(np.asarray(forward(scanned, jnp.asarray(ids, jnp.int32))) - ours).max() < 1e-5


def _hf_greedy(hf, prompt, n):
    import torch

    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.slow
def test_sampler_greedy_equals_transformers_and_logprobs_equal_forward(odd):
    _, hf, model = odd
    rng = np.random.RandomState(4)
    prompts = [rng.randint(2, VOCAB, n).tolist() for n in (9, 3, 14, 1)]
    n = 10
    s = Sampler(model, cache_dtype=jnp.float32)
    outs = s.generate(prompts, max_new_tokens=n)
    for p, o in zip(prompts, outs):
        assert len(o.tokens) == n and o.tokens == _hf_greedy(hf, p, n)
        assert np.abs(np.asarray(o.logprobs) - full_logprobs(model, p, o.tokens)).max() < 1e-4
    # Sampled tokens (temperature, top-p): log-probs those of the full forward under the
    # distribution drawn from, softmax(logits / T) (what the learner scores at that temperature).
    for p, o in zip(prompts, s.generate(prompts, max_new_tokens=8, temperature=1.2, top_p=0.9, seed=3)):
        assert np.abs(np.asarray(o.logprobs) - full_logprobs(model, p, o.tokens, 1.2)).max() < 1e-4
    # A shared prefix stored once (its keys q/k-normed in prefill, read by decode) changes nothing.
    head = rng.randint(2, VOCAB, 20).tolist()
    shared = [head + rng.randint(2, VOCAB, k).tolist() for k in (2, 5, 1)]
    a = s.generate(shared, max_new_tokens=6, share_prefix=True)
    b = s.generate(shared, max_new_tokens=6, share_prefix=False)
    for p, x, y in zip(shared, a, b):
        assert x.tokens == y.tokens == _hf_greedy(hf, p, 6)
        assert np.abs(np.asarray(x.logprobs) - np.asarray(y.logprobs)).max() < 1e-4


@pytest.mark.slow
def test_sharded_sampler_with_q_and_kv_kept_apart():
    # One KV head, 4 query heads on tp=2: q split, k/v replicated (the unfused layout), q/k norms replicated.
    cfg = ModelConfig.tiny(vocab_size=VOCAB, num_kv_heads=1, model_type="qwen3", rms_norm_eps=1e-5)
    model = Qwen2(cfg, rngs=nnx.Rngs(3))
    layers = model.layers
    layers.q_norm.set_value(1.0 + 0.3 * jax.random.normal(jax.random.key(1), layers.q_norm.shape))
    layers.k_norm.set_value(1.0 + 0.3 * jax.random.normal(jax.random.key(2), layers.k_norm.shape))
    rng = np.random.RandomState(5)
    prompts = [rng.randint(2, VOCAB, n).tolist() for n in (7, 2, 12)]
    kw = dict(max_new_tokens=6, temperature=1.0, top_p=0.95, seed=5)
    ref = Sampler(model, cache_dtype=jnp.float32).generate(prompts, **kw)
    s = Sampler(model, cache_dtype=jnp.float32, mesh=make_mesh(2, 2, 2))
    layer = s._params["layers"][0]
    assert "qkv" not in layer and "q_bias" not in layer and layer["q_norm"].shape == (cfg.head_dim,)
    for r, o in zip(ref, s.generate(prompts, **kw)):
        assert o.tokens == r.tokens
        assert np.abs(np.asarray(o.logprobs) - np.asarray(r.logprobs)).max() < 1e-4
        assert np.abs(np.asarray(o.logprobs) - full_logprobs(model, prompts[ref.index(r)], o.tokens)).max() < 1e-4


def test_round_trip_and_transformers_loads_the_export(odd, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

    src, model = odd[0], odd[2]
    dst = tmp_path / "dst"
    save_pretrained(model, str(dst))
    a, b = TensorDirectory(src), TensorDirectory(str(dst))
    assert set(a.keys()) == set(b.keys())
    for k in a.keys():
        assert np.array_equal(a.get(k), b.get(k)), k
    cfg = json.load(open(dst / "config.json"))
    assert cfg["model_type"] == "qwen3" and cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["head_dim"] == 16 and cfg["attention_bias"] is False
    assert ModelConfig.from_hf_config(str(dst)) == model.config
    reloaded = AutoModelForCausalLM.from_pretrained(str(dst)).eval()
    assert isinstance(reloaded, Qwen3ForCausalLM)
    ids = np.random.RandomState(2).randint(0, VOCAB, (2, 9))
    assert np.abs(torch_logits(reloaded, ids) - np.asarray(forward(model, jnp.asarray(ids, jnp.int32)))).max() < 1e-4


def test_jax_built_tied_qwen3_exports_and_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = ModelConfig.tiny(vocab_size=VOCAB, model_type="qwen3", num_heads=4, num_kv_heads=2, head_dim=32)
    model = Qwen2(cfg, rngs=nnx.Rngs(7))
    out = save_pretrained(model, str(tmp_path / "m"), max_shard_bytes=60_000)  # sharded + index
    assert "lm_head.weight" not in TensorDirectory(out).keys()
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = np.random.RandomState(3).randint(0, VOCAB, (2, 8))
    ours = np.asarray(forward(model, jnp.asarray(ids, jnp.int32)))
    assert np.abs(torch_logits(hf, ids) - ours).max() < 1e-4
    assert np.abs(np.asarray(forward(from_pretrained(out), jnp.asarray(ids, jnp.int32))) - ours).max() == 0


def test_presets_and_config_errors():
    # Published totals: Qwen3-0.6B 596,049,920 (keras-hub preset); the others as the HF model cards round them.
    assert ModelConfig.qwen3_0_6b().num_params() == 596_049_920
    for name, billions in {"qwen3_1_7b": 1.7, "qwen3_4b": 4.0, "qwen3_8b": 8.2, "qwen3_14b": 14.8}.items():
        cfg = ModelConfig.from_preset(name)
        assert cfg.model_type == "qwen3" and cfg.max_position_embeddings == 40960 and cfg.head_dim == 128
        assert abs(cfg.num_params() / 1e9 - billions) / billions < 0.02, (name, cfg.num_params())
    assert ModelConfig.from_preset("Qwen3-8B") == ModelConfig.qwen3_8b()
    assert ModelConfig.qwen3_4b().tie_word_embeddings and not ModelConfig.qwen3_14b().tie_word_embeddings
    for name in ("qwen3_0_6b", "qwen3_14b", "qwen2_5_7b"):
        cfg = ModelConfig.from_preset(name)
        assert ModelConfig.from_hf_config(cfg.to_hf_config()) == cfg
    assert ModelConfig.qwen2_5_0_5b().to_hf_config()["architectures"] == ["Qwen2ForCausalLM"]

    hf = ModelConfig.qwen3_0_6b().to_hf_config()
    with pytest.raises(ValueError, match="unsupported model_type 'qwen3_moe'"):
        ModelConfig.from_hf_config({**hf, "model_type": "qwen3_moe"})
    with pytest.raises(ValueError, match="unsupported model_type None"):
        ModelConfig.from_hf_config({k: v for k, v in hf.items() if k != "model_type"})
    with pytest.raises(ValueError, match="attention_bias=true is not supported for qwen3"):
        ModelConfig.from_hf_config({**hf, "attention_bias": True})
    with pytest.raises(ValueError, match="model_type must be one of"):
        ModelConfig.tiny(model_type="llama")
