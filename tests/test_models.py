"""The JAX Qwen2 is numerically the same network as transformers' Qwen2ForCausalLM."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.models import (
    CheckpointError,
    ModelConfig,
    Qwen2,
    ShardingConfig,
    from_pretrained,
    make_mesh,
    param_dict,
    save_pretrained,
    shard_model,
)
from memsearcher_jax.models.safetensors_io import SafetensorsFile, TensorDirectory, save_file
from tests.hf_fixtures import make_hf_qwen2, torch_logits
from tests.reference import forward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PARITY_CONFIGS = {
    # name: transformers Qwen2Config overrides
    "tied_gqa2_theta1e6": dict(num_attention_heads=4, num_key_value_heads=2, rope_theta=1e6),
    "untied_mha_theta1e4": dict(num_attention_heads=4, num_key_value_heads=4, rope_theta=1e4,
                                tie_word_embeddings=False),
    "gqa7_odd_heads": dict(hidden_size=56, num_attention_heads=7, num_key_value_heads=1, rope_theta=1e4,
                           intermediate_size=80),
    "odd_heads3_untied": dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=3,
                              tie_word_embeddings=False, num_hidden_layers=3),
}


def _left_pad(rows: list[np.ndarray], pad: int = 0):
    t = max(len(r) for r in rows)
    ids = np.full((len(rows), t), pad, np.int64)
    mask = np.zeros((len(rows), t), np.int64)
    for i, r in enumerate(rows):
        ids[i, t - len(r):] = r
        mask[i, t - len(r):] = 1
    return ids, mask


@pytest.mark.parametrize("name", sorted(PARITY_CONFIGS))
def test_logit_parity_with_transformers(tmp_path, name):
    hf = make_hf_qwen2(str(tmp_path), **PARITY_CONFIGS[name])
    model = from_pretrained(str(tmp_path))
    rng = np.random.RandomState(1)
    ids = rng.randint(0, 128, (3, 11))
    ours = np.asarray(forward(model, jnp.asarray(ids, jnp.int32)))
    ref = torch_logits(hf, ids)
    assert ours.shape == (3, 11, 128)
    assert np.abs(ours - ref).max() < 1e-4

    # Left padding: ragged rows; compare real-token logits with transformers and with unpadded runs.
    rows = [rng.randint(2, 128, n) for n in (11, 6, 1)]
    pids, pmask = _left_pad(rows)
    ours_p = np.asarray(forward(model, jnp.asarray(pids, jnp.int32), jnp.asarray(pmask)))
    ref_p = torch_logits(hf, pids, pmask)
    real = pmask.astype(bool)
    assert np.isfinite(ours_p).all()
    assert np.abs(ours_p[real] - ref_p[real]).max() < 1e-4
    for i, r in enumerate(rows):
        alone = np.asarray(forward(model, jnp.asarray(r[None], jnp.int32)))[0]
        assert np.abs(ours_p[i, -len(r):] - alone).max() < 1e-4


def test_scan_layers_equals_loop_and_bf16_runs(tmp_path):
    make_hf_qwen2(str(tmp_path), num_hidden_layers=3)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, 128, (2, 7)), jnp.int32)
    loop = np.asarray(from_pretrained(str(tmp_path))(ids))
    scanned = np.asarray(from_pretrained(str(tmp_path), scan_layers=True)(ids))
    assert np.abs(loop - scanned).max() < 1e-5
    bf16 = from_pretrained(str(tmp_path), dtype="bfloat16")
    assert bf16.embed[...].dtype == jnp.bfloat16
    out = np.asarray(bf16(ids))
    assert out.dtype == np.float32 and np.isfinite(out).all()
    # bf16 is a lossy copy of the same network: close, not equal.
    assert np.abs(out - loop).max() < 0.1 * np.abs(loop).max()
    assert np.abs(out - loop).max() > 0


def test_round_trip_is_bit_identical_and_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    src, dst = tmp_path / "src", tmp_path / "dst"
    make_hf_qwen2(str(src), tie_word_embeddings=False)
    model = from_pretrained(str(src))
    save_pretrained(model, str(dst))
    a, b = TensorDirectory(str(src)), TensorDirectory(str(dst))
    assert set(a.keys()) == set(b.keys())
    for k in a.keys():
        assert a.get(k).dtype == b.get(k).dtype
        assert np.array_equal(a.get(k), b.get(k)), k
    cfg = json.load(open(dst / "config.json"))
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert os.path.exists(dst / "generation_config.json")
    reloaded = AutoModelForCausalLM.from_pretrained(str(dst)).eval()
    ids = np.random.RandomState(2).randint(0, 128, (2, 6))
    assert np.abs(torch_logits(reloaded, ids) - np.asarray(forward(model, jnp.asarray(ids, jnp.int32)))).max() < 1e-4


def test_bf16_tied_round_trip_is_bit_identical(tmp_path):
    import torch

    src, dst = tmp_path / "src", tmp_path / "dst"
    hf = make_hf_qwen2(str(tmp_path / "f32"), tie_word_embeddings=True)
    hf.to(torch.bfloat16).save_pretrained(str(src))  # a bf16 checkpoint, as Qwen2.5 ships
    model = from_pretrained(str(src), dtype="bfloat16")  # params stored in the checkpoint's dtype
    save_pretrained(model, str(dst))
    a, b = TensorDirectory(str(src)), TensorDirectory(str(dst))
    assert set(a.keys()) == set(b.keys()) and "lm_head.weight" not in b.keys()  # tied stays tied
    for k in a.keys():
        x, y = a.get(k), b.get(k)
        assert str(x.dtype) == str(y.dtype) == "bfloat16", (k, x.dtype, y.dtype)
        assert np.array_equal(x.view(np.uint16), y.view(np.uint16)), k


@pytest.mark.slow
def test_library_imports_and_runs_without_torch(tmp_path):
    # torch is a test extra only: block it and use the model, the sampler and retrieval.
    code = r"""
import sys
sys.modules["torch"] = None  # any "import torch" now raises ImportError
import jax.numpy as jnp
from flax import nnx
from memsearcher_jax.models import ModelConfig, Qwen2, save_pretrained, from_pretrained
from memsearcher_jax.sampling import generate
from retrieval.bm25 import BM25Retriever
model = Qwen2(ModelConfig.tiny(vocab_size=64), rngs=nnx.Rngs(0))
save_pretrained(model, sys.argv[1])
model = from_pretrained(sys.argv[1])
assert model(jnp.ones((1, 4), jnp.int32)).shape == (1, 4, 64)
out = generate(model, [[1, 2, 3]], max_new_tokens=3)
assert len(out[0].tokens) == 3
hits = BM25Retriever.from_passages([{"id": "0", "contents": "t\nhello world"}]).search(["hello"], 1)
assert hits[0][0].id == "0"
assert "torch" not in {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_no_torch_notice_but_real_warnings_at_start_up():
    """Without torch, transformers announces "PyTorch was not found" at import: our processes
    drop that one line and keep every other transformers warning."""
    code = r"""
import sys, logging
sys.modules["torch"] = None
import memsearcher_jax.data.tokenizer  # what the CLI imports before transformers
import transformers
assert not transformers.utils.is_torch_available()
logging.getLogger("transformers").warning("a real warning")
"""
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "PyTorch was not found" not in r.stderr and "a real warning" in r.stderr
    # and without our import, transformers does print it (so the check above can fail)
    r = subprocess.run([sys.executable, "-c", code.replace("import memsearcher_jax.data.tokenizer", "")],
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300)
    assert "PyTorch was not found" in r.stderr


def test_jax_built_model_exports_sharded_and_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.assets import qwen_tokenizer_dir

    cfg = ModelConfig.tiny(vocab_size=128, num_layers=3)
    model = Qwen2(cfg, rngs=nnx.Rngs(7))
    # Small shard limit: several shards plus the index file.
    out = save_pretrained(model, str(tmp_path / "export"), max_shard_bytes=60_000,
                          tokenizer_dir=qwen_tokenizer_dir())
    files = os.listdir(out)
    assert "model.safetensors.index.json" in files
    assert sum(f.endswith(".safetensors") for f in files) > 1
    assert "tokenizer.json" in files
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = np.random.RandomState(3).randint(0, 128, (2, 8))
    ours = np.asarray(forward(model, jnp.asarray(ids, jnp.int32)))
    assert np.abs(torch_logits(hf, ids) - ours).max() < 1e-4
    # And back into JAX from the sharded layout.
    again = from_pretrained(out)
    assert np.abs(np.asarray(forward(again, jnp.asarray(ids, jnp.int32))) - ours).max() == 0


def test_tokenizer_loads_from_exported_dir(tmp_path):
    from transformers import AutoTokenizer

    from tests.assets import qwen_tokenizer_dir

    out = save_pretrained(Qwen2(ModelConfig.tiny(), rngs=nnx.Rngs(0)), str(tmp_path / "m"),
                          tokenizer_dir=qwen_tokenizer_dir())
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids("<|im_end|>") == 151645
    assert tok.decode(tok.encode("hello world")) == "hello world"


# ----- bad checkpoints: each error names the key or file, and nothing is loaded or compiled -----

@pytest.fixture
def no_arrays(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("an array was created before the checkpoint was validated")
    monkeypatch.setattr(jax, "make_array_from_callback", fail)


def _rewrite(path, edit):
    f = SafetensorsFile(str(path))
    tensors = {k: np.array(f.get(k)) for k in f.keys()}
    del f
    edit(tensors)
    save_file(tensors, str(path))


def test_missing_key_is_named(tmp_path, no_arrays):
    make_hf_qwen2(str(tmp_path))
    _rewrite(tmp_path / "model.safetensors", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing keys \['model.layers.1.mlp.up_proj.weight'\]"):
        from_pretrained(str(tmp_path))


def test_unexpected_key_is_named(tmp_path, no_arrays):
    make_hf_qwen2(str(tmp_path))
    _rewrite(tmp_path / "model.safetensors",
             lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.bias", np.zeros(64, np.float32)))
    with pytest.raises(CheckpointError, match="unexpected keys.*o_proj.bias"):
        from_pretrained(str(tmp_path))


def test_wrong_shape_is_named(tmp_path, no_arrays):
    make_hf_qwen2(str(tmp_path))
    _rewrite(tmp_path / "model.safetensors",
             lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight", np.zeros((16, 64), np.float32)))
    with pytest.raises(CheckpointError, match=r"k_proj.weight.*shape \(16, 64\), expected \(32, 64\)"):
        from_pretrained(str(tmp_path))


def test_unsupported_model_type(tmp_path, no_arrays):
    make_hf_qwen2(str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    cfg["model_type"] = "llama"
    json.dump(cfg, open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match="unsupported model_type 'llama'"):
        from_pretrained(str(tmp_path))


def test_truncated_and_corrupt_files_are_named(tmp_path, no_arrays):
    make_hf_qwen2(str(tmp_path))
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="model.safetensors: truncated"):
        from_pretrained(str(tmp_path))
    path.write_bytes(data[:8] + b"{not json" + data[17:])
    with pytest.raises(CheckpointError, match="model.safetensors: corrupt"):
        from_pretrained(str(tmp_path))
    path.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="model.safetensors: truncated"):
        from_pretrained(str(tmp_path))


def test_index_pointing_at_missing_shard(tmp_path, no_arrays):
    model = Qwen2(ModelConfig.tiny(vocab_size=128), rngs=nnx.Rngs(0))
    out = save_pretrained(model, str(tmp_path / "m"), max_shard_bytes=40_000)
    shard = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))[-1]
    os.remove(os.path.join(out, shard))
    with pytest.raises(CheckpointError, match=shard):
        from_pretrained(out)


# ----- presets and configs -----

def test_presets_match_public_sizes():
    # Parameter counts published for Qwen2.5 Instruct (total, in billions).
    expected = {"qwen2_5_0_5b": 0.49, "qwen2_5_1_5b": 1.54, "qwen2_5_3b": 3.09, "qwen2_5_7b": 7.62,
                "qwen2_5_14b": 14.7}
    for name, billions in expected.items():
        cfg = ModelConfig.from_preset(name)
        assert abs(cfg.num_params() / 1e9 - billions) / billions < 0.02, name
    assert ModelConfig.qwen2_5_14b().rms_norm_eps == 1e-5
    assert not ModelConfig.qwen2_5_7b().tie_word_embeddings and ModelConfig.qwen2_5_3b().tie_word_embeddings
    hf = ModelConfig.qwen2_5_7b().to_hf_config()
    assert ModelConfig.from_hf_config(hf) == ModelConfig.qwen2_5_7b()
    with pytest.raises(ValueError, match="num_heads .* multiple of num_kv_heads"):
        ModelConfig.tiny(num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="unknown model preset"):
        ModelConfig.from_preset("qwen9")


# ----- sharding on a fake 8-device CPU mesh -----

@pytest.mark.parametrize("fsdp,tp", [(4, 2), (2, 4)])
def test_sharded_forward_equals_single_device(fsdp, tp):
    assert jax.device_count() >= 8, "conftest sets 8 fake CPU devices"
    cfg = ModelConfig.tiny(vocab_size=128, hidden_size=64, num_heads=8, num_kv_heads=4, head_dim=8,
                           intermediate_size=128)
    model = Qwen2(cfg, rngs=nnx.Rngs(3))
    ids = jnp.asarray(np.random.RandomState(4).randint(0, 128, (8, 10)), jnp.int32)
    mask = jnp.asarray(np.arange(10)[None, :] >= np.array([0, 3, 0, 5, 1, 0, 9, 2])[:, None])
    single = np.asarray(forward(model, ids, attention_mask=mask))

    mesh = make_mesh(data=1, fsdp=fsdp, tp=tp)
    sharded = shard_model(model, mesh, ShardingConfig.training())
    params = param_dict(sharded)
    q = params["layers.q_kernel"]  # [L, D, H, Dh]: D over fsdp, H over tp
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tp", None)
    assert q.addressable_shards[0].data.shape == (2, 64 // fsdp, 8 // tp, 8)
    assert params["embed"].addressable_shards[0].data.shape == (128 // tp, 64 // fsdp)
    assert params["layers.down_kernel"].addressable_shards[0].data.shape == (2, 128 // tp, 64 // fsdp)

    @jax.jit
    def fwd(graphdef_state, ids, mask):
        return nnx.merge(*graphdef_state)(ids, attention_mask=mask)

    out = fwd(nnx.split(sharded), ids, mask)
    assert np.abs(np.asarray(out) - single).max() < 1e-5

    sampling = shard_model(model, mesh, ShardingConfig.sampling())
    qs = param_dict(sampling)["layers.q_kernel"]
    assert qs.addressable_shards[0].data.shape == (2, 64, 8 // tp, 8)  # no fsdp on weights
    assert np.abs(np.asarray(fwd(nnx.split(sampling), ids, mask)) - single).max() < 1e-5


def test_from_pretrained_places_shards_on_mesh(tmp_path):
    make_hf_qwen2(str(tmp_path), num_attention_heads=8, num_key_value_heads=2, hidden_size=64,
                  intermediate_size=128)
    mesh = make_mesh(data=2, fsdp=2, tp=2)
    model = from_pretrained(str(tmp_path), mesh=mesh)
    params = param_dict(model)
    # K=2 heads over tp=2: sharded; gate [L, D, F] over (fsdp, tp).
    assert params["layers.k_kernel"].addressable_shards[0].data.shape == (2, 32, 1, 8)
    assert params["layers.gate_kernel"].addressable_shards[0].data.shape == (2, 32, 64)
    ref = from_pretrained(str(tmp_path))
    ids = jnp.asarray(np.random.RandomState(5).randint(0, 128, (4, 6)), jnp.int32)
    out = jax.jit(lambda s, x: nnx.merge(*s)(x))(nnx.split(model), ids)
    assert np.abs(np.asarray(out) - np.asarray(ref(ids))).max() < 1e-5


def test_shard_model_moves_only_what_changes_place_and_casts_what_it_moves():
    cfg = ModelConfig.tiny()
    mesh = make_mesh(1, 4, 2)
    trained = shard_model(Qwen2(cfg, rngs=nnx.Rngs(0)), mesh, ShardingConfig.training())
    before = param_dict(trained)
    fresh = nnx.merge(*nnx.split(trained))  # new Variables over the same arrays
    moved = param_dict(shard_model(fresh, mesh, ShardingConfig.sampling(), move_dtype=jnp.bfloat16))
    kinds = set()
    for name, old in before.items():
        new = moved[name]
        same_place = old.sharding.is_equivalent_to(new.sharding, old.ndim)
        kinds.add(same_place)
        if same_place:  # left where it was: the very same buffers, still f32
            assert new.dtype == jnp.float32 and new.addressable_shards[0].data.unsafe_buffer_pointer() == \
                old.addressable_shards[0].data.unsafe_buffer_pointer(), name
        else:  # moved, and moved in bf16
            assert new.dtype == jnp.bfloat16, name
            np.testing.assert_array_equal(np.asarray(new), np.asarray(old.astype(jnp.bfloat16)), err_msg=name)
    assert kinds == {True, False}  # the tiny model has tensors of both kinds on this mesh


def test_one_causal_lm_class_runs_both_families_and_the_old_name_still_works():
    from memsearcher_jax.models import CausalLM, ModelConfig, Qwen2

    assert Qwen2 is CausalLM
    for family in ("qwen2", "qwen3"):
        model = CausalLM(ModelConfig.tiny(model_type=family, num_layers=1), rngs=nnx.Rngs(0))
        params = {"/".join(str(k) for k in path) for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
        # The families differ in their parameters: Qwen2 has q/k/v biases, Qwen3 q/k norms.
        assert any("q_bias" in p for p in params) == (family == "qwen2")
        assert any("q_norm" in p for p in params) == (family == "qwen3")
        assert model(jnp.ones((1, 4), jnp.int32)).shape == (1, 4, 256)


def test_query_blocks_keep_the_block_and_shorten_only_the_last():
    from memsearcher_jax.models.qwen2 import query_blocks

    assert query_blocks(256, 128) == [(0, 128), (128, 256)]
    assert query_blocks(100, 0) == [(0, 100)] and query_blocks(100, 128) == [(0, 100)]
    # No divisor of T near the block (1996 = 4 x 499; 389 is prime): still ~T / block ranges.
    assert query_blocks(389, 128) == [(0, 128), (128, 256), (256, 384), (384, 389)]
    ranges = query_blocks(1996, 128)
    assert len(ranges) == 16 and ranges[-1] == (1920, 1996)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_causal_attention_with_a_short_last_block_equals_attention():
    """T = 389 (prime) in blocks of 128: the last block holds 5 queries; padding slots (masked
    keys) at the end, and causal rows, as a packed row has."""
    from memsearcher_jax.models.qwen2 import attention, causal_attention

    rng = np.random.default_rng(0)
    b, t, h, kh, d = 2, 389, 4, 2, 8
    q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((b, t, h, d), (b, t, kh, d), (b, t, kh, d)))
    valid = np.arange(t)[None, :] < np.array([[t], [300]])
    mask = jnp.asarray(np.tril(np.ones((t, t), bool))[None] & valid[:, None, :] | np.eye(t, dtype=bool)[None])
    want = attention(q, k, v, mask)
    got = jax.jit(causal_attention, static_argnums=4)(q, k, v, mask, 128)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
    # Four blocks in the program (two products each), not one per divisor-sized block.
    jaxpr = jax.make_jaxpr(causal_attention, static_argnums=4)(q, k, v, mask, 128)
    assert sum(e.primitive.name == "dot_general" for e in jaxpr.eqns) == 8
