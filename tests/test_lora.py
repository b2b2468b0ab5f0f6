"""LoRA (model.lora_rank > 0): adapters over a frozen base, for Qwen2 and Qwen3.

At initialisation the adapted model is the base exactly; the adapters' gradient is the one the
merged weights imply and the one finite differences measure; the learner trains the adapters
alone and scores the reference with the base; the sampler decodes with the adapters merged;
export writes merged weights transformers loads (same logits) or PEFT-format adapters; a
sharded LoRA step equals a single-device one and a LoRA run killed between checkpoints resumes
to exactly the uninterrupted result.
"""
from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.models import (
    ModelConfig,
    Qwen2,
    ShardingConfig,
    from_pretrained,
    make_mesh,
    param_dict,
    save_pretrained,
    shard_model,
)
from memsearcher_jax.models.config import LORA_KERNELS
from memsearcher_jax.models.hf_io import PEFT_CONFIG, PEFT_WEIGHTS, hf_state_dict, save_adapters
from memsearcher_jax.models.qwen2 import LoRAParam, merge_lora
from memsearcher_jax.models.safetensors_io import SafetensorsFile
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig, token_logprobs_and_entropy
from memsearcher_jax.sampling import Sampler
from tests.reference import forward, full_logprobs, token_logprobs
from tests.test_grpo import _toy_rows
from tests.test_train_step import SMALL, sigkill_then_resume

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = {
    "qwen2": dict(model_type="qwen2"),
    "qwen3-untied": dict(model_type="qwen3", tie_word_embeddings=False),
}


def lora_cfg(family="qwen2", rank=4, **kw):
    return ModelConfig.tiny(lora_rank=rank, lora_alpha=2.0 * rank, **{**FAMILIES[family], **kw})


def randomize_adapters(model: Qwen2, seed: int = 1, std: float = 0.05) -> Qwen2:
    """Non-zero A and B everywhere, so the adapters change what the model computes."""
    graphdef, adapters, base = nnx.split(model, LoRAParam, nnx.Param)
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [std * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
    return nnx.merge(graphdef, jax.tree.unflatten(tree, leaves), base)


def merged_model(model: Qwen2) -> Qwen2:
    """The same network without adapters: every kernel W + scale A B (float32)."""
    cfg = model.config.replace(lora_rank=0)
    out = Qwen2(cfg, rngs=nnx.Rngs(0))
    stacked = merge_lora(model.layers.stacked(), model.config)
    for name, value in stacked.items():
        getattr(out.layers, name).set_value(value)
    out.embed.set_value(model.embed[...])
    out.final_norm.set_value(model.final_norm[...])
    if not cfg.tie_word_embeddings:
        out.lm_head.set_value(model.lm_head[...])
    return out


def _ids(n=3, t=9, vocab=256, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(2, vocab, (n, t)), jnp.int32)


# ----------------------------------------------------------------------------- the module

@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("scan", [False, True])
def test_at_step_0_the_lora_model_is_the_base_exactly(family, scan):
    base = Qwen2(ModelConfig.tiny(scan_layers=scan, **FAMILIES[family]), rngs=nnx.Rngs(0))
    lora = Qwen2(lora_cfg(family, scan_layers=scan), rngs=nnx.Rngs(0))
    adapters = nnx.state(lora, LoRAParam)
    names = {".".join(map(str, k)) for k, _ in nnx.to_flat_state(adapters)}
    assert names == {f"layers.{t}_lora_{ab}" for t in LORA_KERNELS for ab in "ab"}
    assert all(np.all(np.asarray(v.get_value()) == 0) for k, v in nnx.to_flat_state(adapters) if k[-1].endswith("_b"))
    ids = _ids()
    mask = jnp.ones_like(ids).at[1, :3].set(0)
    np.testing.assert_array_equal(np.asarray(lora(ids, attention_mask=mask)),
                                  np.asarray(base(ids, attention_mask=mask)))
    # The base's own weights are untouched by the adapters' presence.
    for (k, a), (_, b) in zip(nnx.to_flat_state(nnx.state(base, nnx.Param)),
                              [(k, v) for k, v in nnx.to_flat_state(nnx.state(lora, nnx.Param))
                               if not k[-1].endswith(("_lora_a", "_lora_b"))]):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(k))


def test_loading_a_checkpoint_with_lora_gives_fresh_adapters_over_it(tmp_path):
    base = Qwen2(ModelConfig.tiny_untied(model_type="qwen3"), rngs=nnx.Rngs(3))
    save_pretrained(base, str(tmp_path / "base"))
    lora = from_pretrained(str(tmp_path / "base"), lora_rank=2, lora_targets=("q", "v", "down"))
    assert lora.config.lora_targets == ("q", "v", "down")
    assert sorted(k[-1] for k, _ in nnx.to_flat_state(nnx.state(lora, LoRAParam))) == [
        "down_lora_a", "down_lora_b", "q_lora_a", "q_lora_b", "v_lora_a", "v_lora_b"]
    np.testing.assert_array_equal(np.asarray(lora(_ids())), np.asarray(base(_ids())))
    # The Hugging Face keys of a LoRA model are the base's: the adapters are merged in.
    assert [k for k, _ in hf_state_dict(lora)] == [k for k, _ in hf_state_dict(base)]


def test_config_checks_the_lora_fields():
    with pytest.raises(ValueError, match="lora_targets"):
        ModelConfig.tiny(lora_rank=4, lora_targets=("q", "qkv"))
    with pytest.raises(ValueError, match="lora_rank"):
        ModelConfig.tiny(lora_rank=-1)
    with pytest.raises(ValueError, match="lora_alpha"):
        ModelConfig.tiny(lora_rank=4, lora_alpha=0.0)
    # A JSON round trip (checkpoint metadata) gives a list; the config stays the same and hashable.
    import dataclasses

    cfg = lora_cfg()
    again = ModelConfig(**json.loads(json.dumps(dataclasses.asdict(cfg))))
    assert again == cfg and hash(again) == hash(cfg)
    assert cfg.num_lora_params() == sum(int(np.prod(v.get_value().shape)) for _, v in
                                        nnx.to_flat_state(nnx.state(Qwen2(cfg, rngs=nnx.Rngs(0)), LoRAParam)))


# ----------------------------------------------------------------------------- gradients

def _loss(model, tokens, attention, weights):
    logp, entropy = token_logprobs_and_entropy(model, tokens, attention)
    return jnp.sum(weights * (logp + 0.3 * entropy))


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.slow
def test_adapter_gradient_equals_the_merged_weights_gradient_and_finite_differences(family):
    model = randomize_adapters(Qwen2(lora_cfg(family, rank=3), rngs=nnx.Rngs(0)), std=0.1)
    cfg = model.config
    tokens = _ids(3, 10)
    attention = jnp.ones_like(tokens).at[2, 7:].set(0)
    weights = jnp.asarray(np.random.default_rng(1).uniform(0.5, 1.5, tokens.shape), jnp.float32) * attention
    graphdef, adapters, base = nnx.split(model, LoRAParam, nnx.Param)
    f = jax.jit(lambda a: _loss(nnx.merge(graphdef, a, base), tokens, attention, weights))
    grads = jax.jit(jax.grad(lambda a: _loss(nnx.merge(graphdef, a, base), tokens, attention, weights)))(adapters)
    got = {k[-1]: np.asarray(v.get_value()) for k, v in nnx.to_flat_state(grads)}

    # Reference 1: the merged network's gradient G with respect to each kernel W' = W + s A B gives
    # dL/dA = s G B^T and dL/dB = s A^T G (contracting the output, resp. input, dims).
    full = merged_model(model)
    fg, fparams = nnx.split(full, nnx.Param)
    kgrads = jax.jit(jax.grad(lambda p: _loss(nnx.merge(fg, p), tokens, attention, weights)))(fparams)
    kgrad = {k[-1]: np.asarray(v.get_value()) for k, v in nnx.to_flat_state(kgrads)}
    flat = {k[-1]: np.asarray(v.get_value()) for k, v in nnx.to_flat_state(adapters)}
    s = cfg.lora_scale
    for t in cfg.lora_targets:
        kernel, n_in = LORA_KERNELS[t]
        g, a, b = kgrad[kernel], flat[f"{t}_lora_a"], flat[f"{t}_lora_b"]
        n_out = g.ndim - 1 - n_in
        want_a = s * np.stack([np.tensordot(g[i], b[i], axes=(list(range(n_in, n_in + n_out)),
                                                                list(range(1, 1 + n_out))))
                               for i in range(cfg.num_layers)])
        want_b = s * np.stack([np.tensordot(a[i], g[i], axes=(list(range(n_in)), list(range(n_in))))
                               for i in range(cfg.num_layers)])
        for name, want in ((f"{t}_lora_a", want_a), (f"{t}_lora_b", want_b)):
            scale = np.abs(want).max()
            assert scale > 0, name
            np.testing.assert_allclose(got[name], want, atol=2e-5 * scale, rtol=1e-4, err_msg=name)

    # Reference 2: central finite differences of the loss along a random direction in each
    # target's (A, B), against <gradient, direction>.
    rng = np.random.default_rng(2)
    for t in cfg.lora_targets:
        direction = jax.tree.map(jnp.zeros_like, adapters)
        for ab in "ab":
            var = direction["layers"][f"{t}_lora_{ab}"]
            d = rng.normal(size=var.get_value().shape).astype(np.float32)
            var.set_value(jnp.asarray(d / np.linalg.norm(d)))
        eps = 1e-2
        plus = jax.tree.map(lambda x, d: x + eps * d, adapters, direction)
        minus = jax.tree.map(lambda x, d: x - eps * d, adapters, direction)
        fd = (float(f(plus)) - float(f(minus))) / (2 * eps)
        analytic = sum(float(jnp.sum(g * d)) for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(direction)))
        assert abs(fd - analytic) < 1e-2 * max(abs(analytic), 1e-1), (t, fd, analytic)


# ----------------------------------------------------------------------------- learner and sampler

@pytest.mark.slow
def test_learner_trains_the_adapters_alone_over_a_frozen_reference():
    model = Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1, lora_rank=4, lora_alpha=8.0), rngs=nnx.Rngs(1))
    learner = GRPOLearner(model, GRPOConfig(optimizer_steps=2, micro_batch_size=2, logprob_batch_size=4, min_seq_len=64,
                                            optim=OptimConfig(learning_rate=1e-2)))
    assert {k[-1] for k, _ in nnx.to_flat_state(learner.params)} == {f"{t}_lora_{ab}" for t in LORA_KERNELS
                                                                      for ab in "ab"}
    # AdamW's moments cover the adapters alone.
    moments = [x for x in jax.tree.leaves(learner.opt_state) if x.ndim]
    assert sum(x.size for x in moments) == 2 * sum(x.size for x in jax.tree.leaves(learner.params))
    assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(learner.ref_params))
    base_before = jax.tree.map(np.asarray, learner.frozen)
    before = jax.tree.map(np.asarray, learner.params)
    rows = _toy_rows()
    base_logp = np.asarray(token_logprobs(Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(1)),
                                          jnp.asarray(rows.tokens), jnp.asarray(rows.attention)))
    m = learner.train_on_rows(rows, np.random.default_rng(0))
    assert m["skipped"] == 0
    after = jax.tree.map(np.asarray, learner.params)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    for a, b in zip(jax.tree.leaves(base_before), jax.tree.leaves(learner.frozen)):
        np.testing.assert_array_equal(a, np.asarray(b))
    # The reference is the base: its log-probs are the pretrained model's, after the update too.
    ref = learner.compute_logprobs(learner.ref_params, rows)
    read = rows.loss_mask != 0  # the positions the loss reads (compute_logprobs gives those)
    np.testing.assert_allclose(ref[read], base_logp[read], atol=1e-6)
    assert np.abs(learner.compute_logprobs(learner.params, rows) - ref).max() > 1e-4


def test_sft_refuses_a_lora_model():
    from memsearcher_jax.rl.sft import SFTConfig, SFTTrainer

    with pytest.raises(ValueError, match="without LoRA"):
        SFTTrainer(Qwen2(lora_cfg(), rngs=nnx.Rngs(0)), SFTConfig(steps=1, warmup=0, progress=False))


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.slow
def test_sampler_decodes_with_the_adapters_merged(family):
    model = randomize_adapters(Qwen2(lora_cfg(family, max_position_embeddings=128), rngs=nnx.Rngs(0)))
    prompts = [[5, 9, 17, 33, 4], [7, 7, 100, 3, 200, 41, 12]]
    outs = Sampler(model, cache_dtype=jnp.float32).generate(prompts, max_new_tokens=8)
    merged = Sampler(merged_model(model), cache_dtype=jnp.float32).generate(prompts, max_new_tokens=8)
    base = Sampler(Qwen2(lora_cfg(family, max_position_embeddings=128), rngs=nnx.Rngs(0)),
                   cache_dtype=jnp.float32).generate(prompts, max_new_tokens=8)
    assert [o.tokens for o in outs] == [o.tokens for o in merged] != [o.tokens for o in base]
    for p, o in zip(prompts, outs):
        assert np.abs(np.asarray(o.logprobs) - full_logprobs(model, p, o.tokens)).max() < 1e-4
    # layer_by_layer builds the same weights, one layer at a time.
    pieces = Sampler(model, cache_dtype=jnp.float32, layer_by_layer=True)
    assert [o.tokens for o in pieces.generate(prompts, max_new_tokens=8)] == [o.tokens for o in outs]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_layer_by_layer_sampler_on_a_mesh_builds_and_refreshes_in_place(family):
    mesh = make_mesh(1, 4, 2, devices=jax.devices()[:8])
    cfg = lora_cfg(family, num_heads=4, num_kv_heads=2)
    model = shard_model(randomize_adapters(Qwen2(cfg, rngs=nnx.Rngs(0))), mesh, ShardingConfig.training())
    assert param_dict(model)["layers.q_kernel"].sharding.spec[1] == "fsdp"
    pieces = Sampler(model, cache_dtype=jnp.float32, mesh=mesh, layer_by_layer=True)
    whole = Sampler(model, cache_dtype=jnp.float32, mesh=mesh)
    # The model was read where it lies: still in the training layout.
    assert param_dict(model)["layers.q_kernel"].sharding.spec[1] == "fsdp"
    for a, b in zip(jax.tree.leaves(pieces._params), jax.tree.leaves(whole._params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
    # A refresh replaces the arrays layer by layer, inside the same dict and list.
    layers = pieces._params["layers"]
    old = jax.tree.leaves(layers)
    newer = shard_model(randomize_adapters(model, seed=7), mesh, ShardingConfig.training())
    pieces.update_params(newer)
    whole.update_params(newer)
    assert pieces._params["layers"] is layers
    assert not any(a is b for a, b in zip(jax.tree.leaves(layers), old))
    for a, b in zip(jax.tree.leaves(pieces._params), jax.tree.leaves(whole._params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    prompts = [[5, 9, 17, 33, 4]] * 4 + [[7, 100, 3, 200, 41, 12]] * 4
    assert ([o.tokens for o in pieces.generate(prompts, max_new_tokens=6)]
            == [o.tokens for o in whole.generate(prompts, max_new_tokens=6)])


# ----------------------------------------------------------------------------- export

def _check_peft_files(out, cfg: ModelConfig):
    with open(os.path.join(out, PEFT_CONFIG), encoding="utf-8") as f:
        conf = json.load(f)
    assert conf["peft_type"] == "LORA" and conf["task_type"] == "CAUSAL_LM"
    assert conf["r"] == cfg.lora_rank and conf["lora_alpha"] == cfg.lora_alpha
    assert sorted(conf["target_modules"]) == sorted(f"{t}_proj" for t in cfg.lora_targets)
    tensors = SafetensorsFile(os.path.join(str(out), PEFT_WEIGHTS))
    d, f, h, k, dh, r = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.lora_rank)
    io = {"self_attn.q_proj": (d, h * dh), "self_attn.k_proj": (d, k * dh), "self_attn.v_proj": (d, k * dh),
          "self_attn.o_proj": (h * dh, d), "mlp.gate_proj": (d, f), "mlp.up_proj": (d, f), "mlp.down_proj": (f, d)}
    want = {}
    for i in range(cfg.num_layers):
        for mod, (n_in, n_out) in io.items():
            want[f"base_model.model.model.layers.{i}.{mod}.lora_A.weight"] = (r, n_in)
            want[f"base_model.model.model.layers.{i}.{mod}.lora_B.weight"] = (n_out, r)
    assert {key: tuple(tensors.shape(key)) for key in tensors.keys()} == want
    return tensors


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_merges_and_transformers_gives_the_same_logits(family, tmp_path):
    pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from tests.hf_fixtures import torch_logits

    base = Qwen2(ModelConfig.tiny(vocab_size=128, max_position_embeddings=128, **FAMILIES[family]),
                 rngs=nnx.Rngs(0))
    save_pretrained(base, str(tmp_path / "base"))
    model = randomize_adapters(from_pretrained(str(tmp_path / "base"), lora_rank=4, lora_alpha=8.0))
    ids = np.asarray(_ids(2, 9, vocab=128))
    ours = np.asarray(forward(model, jnp.asarray(ids)))
    assert np.abs(ours - np.asarray(base(jnp.asarray(ids)))).max() > 1e-3  # the adapters matter
    save_pretrained(model, str(tmp_path / "merged"))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    assert np.abs(torch_logits(hf, ids) - ours).max() < 1e-4

    # Adapters alone, in PEFT's format; loaded by peft over the base when it is installed.
    save_adapters(model, str(tmp_path / "adapters"), base_model_name_or_path=str(tmp_path / "base"))
    tensors = _check_peft_files(tmp_path / "adapters", model.config)
    # lora_B @ lora_A * alpha / r is the merged weight's change, in Hugging Face's [out, in] layout.
    key = "base_model.model.model.layers.1.self_attn.o_proj"
    delta = model.config.lora_scale * tensors.get(f"{key}.lora_B.weight") @ tensors.get(f"{key}.lora_A.weight")
    hf_base = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")).eval()
    got = (hf.model.layers[1].self_attn.o_proj.weight - hf_base.model.layers[1].self_attn.o_proj.weight).detach()
    np.testing.assert_allclose(delta, got.numpy(), atol=1e-6)
    try:
        from peft import PeftModel
    except ImportError:
        return
    peft_model = PeftModel.from_pretrained(hf_base, str(tmp_path / "adapters")).eval()
    assert np.abs(torch_logits(peft_model, ids) - ours).max() < 1e-4


# ----------------------------------------------------------------------------- the training job

LORA_SMALL = [("model.lora_rank", "4"), ("model.lora_alpha", "8.0"), ("optim.learning_rate", "1e-2")]


def _config(tmp_path, name, extra=()):
    from memsearcher_jax.settings import load_settings

    overrides = SMALL + LORA_SMALL + [("world.cache_dir", str(tmp_path / "worlds")),
                                      ("train.output_dir", str(tmp_path / name))] + list(extra)
    return load_settings(os.path.join(ROOT, "configs/default.py"), overrides)


@pytest.mark.slow
def test_sharded_lora_step_equals_single_device_and_exports(tmp_path, capsys):
    from memsearcher_jax.app.experiment import build_setup, build_trainer
    from memsearcher_jax.app.jobs import restore_policy
    from memsearcher_jax.cli import main as cli_main

    single_cfg = _config(tmp_path, "single")
    setup = build_setup(single_cfg)
    single = build_trainer(single_cfg, setup, progress=False)
    base_before = {k: np.asarray(v) for k, v in param_dict(single.learner.model()).items() if "_lora_" not in k}
    single.train_step()
    m1 = single.train_step()
    p1 = {k: np.asarray(v) for k, v in param_dict(single.learner.model()).items()}

    sharded = build_trainer(_config(tmp_path, "sharded", [("mesh.data", "2"), ("mesh.fsdp", "2"), ("mesh.tp", "2")]),
                            setup, progress=False)
    assert sharded.sampler.layer_by_layer
    sharded.train_step()
    m2 = sharded.train_step()
    p2 = {k: np.asarray(jax.device_get(v)) for k, v in param_dict(sharded.learner.model()).items()}
    assert m1["rows"] == m2["rows"] and m1["trained_tokens"] == m2["trained_tokens"]
    # The adapters moved, the same on 8 devices as on one; the base never did.
    assert any(np.abs(p1[k]).max() > 0 for k in p1 if k.endswith("_lora_b"))
    worst = max(float(np.abs(p1[k] - p2[k]).max()) for k in p1)
    assert worst < 1e-5, worst
    for k, v in base_before.items():
        np.testing.assert_array_equal(v, p1[k], err_msg=k)
    # The sampler decodes with the trained adapters: it scores the sampled ids as the learner does.
    assert m2["logprob_gap_max"] < 1e-3

    # The checkpoint holds the adapters and their optimizer state; export merges them onto the base.
    single.save(block=True)
    out = str(tmp_path / "single")
    ckpt = os.path.join(out, "checkpoints", str(single.step), "params")
    assert os.path.isdir(ckpt)
    restored, meta = restore_policy(out)
    assert meta["lora_base"] == os.path.join(out, "lora_base")
    for k, v in param_dict(restored).items():
        np.testing.assert_array_equal(np.asarray(v), p1[k], err_msg=k)
    assert cli_main(["export-hf", "--checkpoint", out, "--out", str(tmp_path / "hf")]) == 0
    exported = from_pretrained(str(tmp_path / "hf"))
    ids = _ids(2, 7, vocab=restored.config.vocab_size)
    np.testing.assert_allclose(np.asarray(forward(exported, ids)), np.asarray(forward(restored, ids)), atol=1e-4)
    assert cli_main(["export-hf", "--checkpoint", out, "--out", str(tmp_path / "peft"), "--adapters-only"]) == 0
    assert "PEFT LoRA adapters" in capsys.readouterr().out
    _check_peft_files(tmp_path / "peft", restored.config)


def _train_cmd(out, steps, worlds):
    args = [sys.executable, "-m", "memsearcher_jax.cli", "train", "--config", os.path.join(ROOT, "configs/default.py")]
    for k, v in SMALL + LORA_SMALL + [("world.cache_dir", worlds), ("train.output_dir", out),
                                      ("train.steps", str(steps)), ("train.save_every", "2"), ("train.keep", "5")]:
        args.append(f"--config.{k}={v}")
    return args


@pytest.mark.slow
def test_lora_sigkill_between_checkpoints_then_resume_matches_uninterrupted(tmp_path):
    ref, resumed = sigkill_then_resume(_train_cmd, tmp_path)
    assert any(k.endswith("_lora_b") and np.abs(v).max() > 0 for k, v in ref.items())  # the adapters trained
    for k in ref:
        np.testing.assert_array_equal(ref[k], resumed[k], err_msg=k)
