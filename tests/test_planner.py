"""Memory planner: exact parameter-shaped rows against live sharded arrays, the fit check, recipes."""
from __future__ import annotations

import glob
import os
from collections import defaultdict
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax import planner
from memsearcher_jax.config_utils import load_config
from memsearcher_jax.models import ModelConfig, Qwen2, ShardingConfig, make_mesh, shard_model
from memsearcher_jax.models.sharding import named_sharding
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = sorted(glob.glob(os.path.join(ROOT, "configs", "recipe_qwen*.py")))


def tiny_cfg(data=1, fsdp=1, tp=1, **model):
    cfg = load_config(os.path.join(ROOT, "configs", "default.py"), [])
    cfg.model.vocab_size = 256
    cfg.model.hidden_size, cfg.model.intermediate_size, cfg.model.num_layers = 64, 128, 2
    cfg.model.num_heads, cfg.model.num_kv_heads, cfg.model.head_dim = 4, 2, 16
    for k, v in model.items():
        cfg.model[k] = v
    cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp = data, fsdp, tp
    cfg.rl.batch_questions, cfg.rl.group_size = 8, 2
    cfg.sampler.max_cache_len = 64
    cfg.sampler.cache_dtype = "float32"
    return cfg


def per_device_bytes(tree) -> int:
    """Largest per-device total of the live shards in `tree`."""
    held = defaultdict(int)
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            for shard in leaf.addressable_shards:
                held[shard.device] += shard.data.nbytes
    return max(held.values())


@pytest.mark.parametrize("mesh_shape", [(1, 4, 2), (2, 2, 2), (1, 1, 8), (1, 8, 1)])
def test_plan_matches_bytes_held_by_live_arrays(mesh_shape):
    cfg = tiny_cfg(*mesh_shape)
    plan = planner.plan_memory(cfg)
    mc = planner.model_config_for_plan(cfg)
    mesh = make_mesh(*mesh_shape, devices=jax.devices()[:8])
    model = shard_model(Qwen2(mc, rngs=nnx.Rngs(0)), mesh, ShardingConfig.training())
    model_params = nnx.state(model, nnx.Param)
    learner = GRPOLearner(model, GRPOConfig(), mesh=mesh)
    # A fresh module over new Variables: shard_model on learner.model() would re-place the
    # learner's own params (nnx.merge shares Variables with the State it is given).
    fresh = nnx.merge(learner.graphdef, jax.tree.map(lambda x: x, learner.params))
    sampling = shard_model(fresh, mesh, ShardingConfig.sampling())
    assert jax.tree.leaves(learner.params)[0].sharding.spec == jax.tree.leaves(model_params)[0].sharding.spec
    samp_params = nnx.state(sampling, nnx.Param)
    # Sampler copy: only shards in new buffers (an equivalent layout aliases the training buffers).
    train_bufs = {sh.data.unsafe_buffer_pointer() for x in jax.tree.leaves(learner.params) for sh in x.addressable_shards}
    copied = defaultdict(int)
    for x in jax.tree.leaves(samp_params):
        for sh in x.addressable_shards:
            if sh.data.unsafe_buffer_pointer() not in train_bufs:
                copied[sh.device] += sh.data.nbytes
    rows = cfg.rl.batch_questions * cfg.rl.group_size
    shape = (mc.num_layers, rows, 64, mc.num_kv_heads, mc.head_dim)
    sh = named_sharding(mesh, shape, ShardingConfig.training().cache)
    kv = [jax.device_put(jnp.zeros(shape, jnp.float32), sh) for _ in range(2)]
    measured = {
        "params": per_device_bytes(learner.params),
        "reference params": per_device_bytes(learner.ref_params),
        "optimizer state": per_device_bytes(learner.opt_state),
        "sampler weights": max(copied.values(), default=0),
        "KV cache": per_device_bytes(kv),
    }
    for name, got in measured.items():
        want = plan.row(name).bytes
        if got == 0:
            assert want == 0, f"{name}: planned {want} bytes but nothing is held"
        else:
            assert abs(want - got) / got < 0.2, f"{name} on mesh {mesh_shape}: planned {want}, measured {got}"
    # Parameter rows are exact, not merely within 20%.
    assert plan.row("params").bytes == measured["params"]
    assert plan.row("KV cache").bytes == measured["KV cache"]


def test_unsharded_params_are_num_params_times_itemsize():
    cfg = load_config(os.path.join(ROOT, "configs", "memsearcher_qwen2_5_3b.py"), [])
    cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp = 1, 1, 1
    plan = planner.plan_memory(cfg)
    n = ModelConfig.qwen2_5_3b().num_params()
    assert plan.model_name == "qwen2_5_3b" or "3085" in plan.model_name
    assert plan.row("params").bytes == 4 * n
    assert plan.row("optimizer state").bytes == 8 * n
    assert plan.row("sampler weights").bytes == 0  # one device: the sampler shares the arrays


def test_more_sharding_never_costs_more_per_device():
    one = planner.plan_memory(tiny_cfg(1, 1, 1))
    eight = planner.plan_memory(tiny_cfg(1, 4, 2))
    for name in ("params", "optimizer state", "KV cache", "train activations", "loss logits"):
        assert eight.row(name).bytes < one.row(name).bytes, name
    assert eight.total_bytes < one.total_bytes


def test_remat_lowers_the_activation_estimate():
    cfg = tiny_cfg(num_layers=8)
    no = planner.plan_memory(cfg).row("train activations").bytes
    cfg.model.remat = True
    yes = planner.plan_memory(cfg).row("train activations").bytes
    assert yes < no / 2


def test_total_is_persistent_plus_the_largest_phase():
    plan = planner.plan_memory(tiny_cfg(1, 4, 2))
    phases = {p: plan.phase_bytes(p) for p in ("rollout", "scoring", "update")}
    assert plan.total_bytes == plan.phase_bytes("persistent") + max(phases.values())
    assert plan.total_bytes < sum(r.bytes for r in plan.rows)


def test_check_fits_raises_with_the_table_and_passes_with_room():
    cfg = tiny_cfg(1, 4, 2)
    with pytest.raises(planner.PlanError) as err:
        planner.check_fits(cfg, device_memory_gib=1e-4)
    msg = str(err.value)
    assert "does not fit" in msg and "KV cache" in msg and "fits: NO" in msg
    plan = planner.check_fits(cfg, device_memory_gib=64)
    assert plan.fits is True
    cfg.hardware = {"device_kind": "cpu", "num_devices": 8, "device_memory_gib": 1e-4}
    with pytest.raises(planner.PlanError, match="does not fit"):
        planner.check_fits(cfg)
    # No capacity anywhere: nothing to check against, so it passes.
    assert planner.check_fits(tiny_cfg(1, 4, 2)).fits is None


def test_mesh_and_hardware_disagree_is_an_error():
    cfg = tiny_cfg(1, 4, 2)
    cfg.hardware = {"device_kind": "TPU v5e", "num_devices": 64, "device_memory_gib": 16.0}
    with pytest.raises(planner.PlanError, match="hardware.num_devices is 64"):
        planner.plan_memory(cfg)


def test_unplannable_source_names_the_key():
    cfg = tiny_cfg()
    cfg.model.source = "/nowhere/custom-model"
    with pytest.raises(planner.PlanError, match="model.source='/nowhere/custom-model'"):
        planner.plan_memory(cfg)
    cfg.model.source = "/nowhere/Qwen2.5-7B-Instruct"  # a preset is inferred from the directory name
    assert planner.model_config_for_plan(cfg).hidden_size == 3584


def test_main_prints_the_table_and_exit_code(capsys):
    cfg = tiny_cfg(1, 4, 2)
    assert planner.main(cfg, SimpleNamespace(device_memory_gib=64.0)) == 0
    out = capsys.readouterr().out
    assert "mesh data=1 fsdp=4 tp=2" in out and "fits: yes" in out
    assert planner.main(cfg, SimpleNamespace(device_memory_gib=1e-4)) == 1
    assert "fits: NO" in capsys.readouterr().out


def test_cli_plan_subcommand(capsys):
    from memsearcher_jax.cli import main as cli_main

    rc = cli_main(["plan", "--config", os.path.join(ROOT, "configs", "memsearcher_qwen2_5_3b.py"),
                   "--device-memory-gib", "1000"])
    assert rc == 0 and "fits: yes" in capsys.readouterr().out


@pytest.mark.parametrize("path", RECIPES, ids=[os.path.basename(p) for p in RECIPES])
def test_every_recipe_plans_as_it_claims(path):
    cfg = load_config(path, [])
    plan = planner.plan_memory(cfg)
    hw = cfg.hardware
    assert plan.capacity_bytes == int(hw.device_memory_gib * planner.GIB * hw.get("usable_fraction", 0.9))
    # A recipe that cannot fit says so (fits_expected=False) with the reason in its comment.
    assert plan.fits == hw.get("fits_expected", True), f"{os.path.basename(path)}:\n{plan.table()}"
    assert cfg.rl.batch_questions == 256 and cfg.rl.group_size == 5


def test_recipes_cover_every_model_and_pod():
    names = {os.path.basename(p) for p in RECIPES}
    for model in ("3b", "7b", "14b"):
        for pod in ("v4_32", "v5e_64", "v5p_128", "h100_8"):
            assert f"recipe_qwen2_5_{model}_{pod}.py" in names, f"missing recipe for {model} on {pod}"
