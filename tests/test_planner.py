"""Memory planner: exact parameter-shaped rows against live sharded arrays, the fit check, recipes."""
from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.app.plan_check import compare, measure_sampler_call, per_device_bytes
from memsearcher_jax.models import ModelConfig, Qwen2, ShardingConfig, make_mesh, shard_model
from memsearcher_jax.plan import planner
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner
from memsearcher_jax.sampling import Sampler
from memsearcher_jax.settings import load_settings
from memsearcher_jax.settings.config_utils import load_config_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "configs", "recipe.py")
PAIRS = sorted(load_config_module(RECIPE).RECIPES)  # (model, pod): `configs/recipe.py:model,pod`
RECIPES = [f"{RECIPE}:{model},{pod}" for model, pod in PAIRS]


def tiny_settings(data=1, fsdp=1, tp=1, **model):
    """The default config's settings with a tiny model (`model`: its fields changed) on mesh data x fsdp x tp."""
    s = load_settings(os.path.join(ROOT, "configs", "default.py"), [("model.source", "init")])
    return s.with_values({
        "model.vocab_size": 256, "model.hidden_size": 64, "model.intermediate_size": 128, "model.num_layers": 2,
        "model.num_heads": 4, "model.num_kv_heads": 2, "model.head_dim": 16,
        **{f"model.{k}": v for k, v in model.items()},
        "mesh.data": data, "mesh.fsdp": fsdp, "mesh.tp": tp,
        "rl.batch_questions": 8, "rl.group_size": 2,
        # Short calls: prompts of at most 95 tokens, budgets of at most 24.
        "agent.max_context_tokens": 96, "agent.max_new_tokens": 24, "agent.max_response_tokens": 64,
        "agent.memory_budget": 16,
        "sampler.cache_dtype": "float32"})


@pytest.mark.parametrize("mesh_shape, dtype", [((1, 4, 2), "float32"), ((2, 2, 2), "float32"), ((1, 1, 8), "float32"),
                                               ((1, 8, 1), "float32"), ((1, 4, 2), "bfloat16")])
def test_plan_matches_bytes_held_by_live_arrays(mesh_shape, dtype):
    # dtype: the compute dtype over f32 master weights (the sampler's copy is kept in it).
    s = tiny_settings(*mesh_shape, dtype=dtype)
    plan = planner.plan_memory(s)
    mc = planner.model_config_for_plan(s)
    mesh = make_mesh(*mesh_shape, devices=jax.devices()[:8])
    model = shard_model(Qwen2(mc, rngs=nnx.Rngs(0)), mesh, ShardingConfig.training())
    model_params = nnx.state(model, nnx.Param)
    learner = GRPOLearner(model, GRPOConfig(logprob_batch_size=16, min_seq_len=64), mesh=mesh)
    # A fresh module over new Variables: shard_model on learner.model() would re-place the
    # learner's own params (nnx.merge shares Variables with the State it is given).
    fresh = nnx.merge(learner.graphdef, jax.tree.map(lambda x: x, learner.params))
    sampling = shard_model(fresh, mesh, ShardingConfig.sampling(), move_dtype=mc.dtype)
    assert jax.tree.leaves(learner.params)[0].sharding.spec == jax.tree.leaves(model_params)[0].sharding.spec
    samp_params = nnx.state(sampling, nnx.Param)
    # As the trainer does: the Sampler is built from (and refreshed with) the re-laid-out model.
    sampler = Sampler(sampling, cache_dtype=jnp.float32, mesh=mesh)

    def new_bytes(tree, known):  # per device: shards in buffers none of `known` holds
        held = defaultdict(int)
        for x in jax.tree.leaves(tree):
            for sh in x.addressable_shards:
                if sh.data.unsafe_buffer_pointer() not in known:
                    held[sh.device] += sh.data.nbytes
        return held

    def buffers(tree):
        return {sh.data.unsafe_buffer_pointer() for x in jax.tree.leaves(tree) for sh in x.addressable_shards}

    # Re-laid-out model: only shards in new buffers (an equivalent layout aliases the training ones).
    relaid = new_bytes(samp_params, buffers(learner.params))
    own = new_bytes(sampler._params, buffers(learner.params) | buffers(samp_params))
    measured = {
        "params": per_device_bytes(learner.params),
        "reference params": per_device_bytes(learner.ref_params),
        "optimizer state": per_device_bytes(learner.opt_state),
        "sampler weights": max(own.values(), default=0),
        # update_params: a new per-layer copy from a freshly re-laid-out model, the old copy still held
        "sampler refresh": max(relaid[d] + own[d] for d in own),
    }
    for name, got in measured.items():
        want = plan.row(name).bytes
        if got == 0:
            assert want == 0, f"{name}: planned {want} bytes but nothing is held"
        else:
            assert abs(want - got) / got < 0.2, f"{name} on mesh {mesh_shape}: planned {want}, measured {got}"
    # Parameter rows are exact, not merely within 20%.
    for name in ("params", "sampler weights", "sampler refresh"):
        assert plan.row(name).bytes == measured[name], name


def run_real_sampler(s, call, attention_by_row=None):
    """(live KV bytes per device, the cache's per-layer shape, the compiled prefill's temporary
    bytes per device) of the trainer's Sampler for settings `s` on one call shaped like `call`."""
    got = measure_sampler_call(s, call, attention_by_row)
    return got["kv"], got["kv_shape"], got["prefill_temp"]


@pytest.mark.parametrize("mesh_shape, hosts, batch_size", [
    ((1, 1, 1), 1, 0), ((1, 4, 2), 1, 0), ((2, 2, 2), 1, 6), ((1, 4, 2), 2, 0)],
    ids=["one-device", "fsdp4-tp2", "data2-fsdp2-tp2-chunks-of-6", "two-hosts-of-4"])
def test_kv_row_is_the_cache_the_real_sampler_allocates(mesh_shape, hosts, batch_size):
    s = tiny_settings(*mesh_shape).with_values({"sampler.batch_size": batch_size})
    if hosts > 1:  # each host samples its B*G / hosts rows on its own (1, 4 / tp, tp) mesh
        s = s.with_values({"hardware.device_kind": "cpu", "hardware.num_devices": 8, "hardware.hosts": hosts})
    plan = planner.plan_memory(s)
    call = plan.sampler_call
    mc = planner.model_config_for_plan(s)
    kv, shape, _ = run_real_sampler(s, call)
    assert shape == (call.batch, mc.num_kv_heads, call.suffix + call.new, mc.head_dim)
    want = plan.row("KV cache").bytes
    assert abs(want - kv) / kv < 0.2, f"planned {want}, the sampler holds {kv}"
    assert want == kv  # in fact exact
    if batch_size:
        assert (call.rows, call.batch) == (6, 8)  # 6 rows padded to the bucket, a multiple of 4 shards
    if hosts > 1:
        assert call.mesh == (1, 2, 2) and call.rows == 8


def test_shared_prefix_split_shapes_match_the_sampler():
    # A batch sharing a prefix is cached as prefix bucket + suffix bucket + budget bucket, which
    # can exceed the unsplit prompt bucket: the planner's widest split is the sampler's.
    s = tiny_settings(1, 4, 2)
    calls = planner.sampler_calls(s)
    widest = max((c for c in calls if c.shared_prefix > 0), key=lambda c: c.slots)
    assert widest.prefix == 64 and widest.shared_prefix <= 64  # the turn loop's one prefix slot
    got = measure_sampler_call(s, widest)
    assert got["kv_shape"][2] + got["prefix_shape"][2] == widest.slots
    assert got["prefix_shape"][:3] == (1, s.model.num_kv_heads, widest.prefix)
    # The prefix is held once, not once per row. Per device on the 1x4x2 mesh: rows split 4
    # ways, the 2 KV heads 2 ways, the prefix replicated over the row shards.
    per_device = 2 * s.model.num_layers * (s.model.num_kv_heads // 2) * s.model.head_dim * 4 * (
        widest.batch // 4 * (widest.suffix + widest.new) + widest.prefix)
    assert got["kv"] == per_device


@pytest.mark.parametrize("context, block, layers, ffn, rows", [
    (400, 0, 2, 128, 16), (400, 64, 2, 128, 16), (400, 16, 6, 128, 16), (800, 128, 2, 128, 16),
    (400, 0, 2, 512, 16), (400, 16, 2, 512, 4), (200, 32, 2, 512, 16), (800, 256, 2, 512, 8)],
    ids=["unblocked", "blocks-of-64", "blocks-of-16-six-layers", "shared-prefix-blocks-of-128",
         "wide-mlp-unblocked", "wide-mlp-4-rows", "wide-mlp-short-prompts", "wide-mlp-shared-prefix"])
def test_prefill_row_tracks_the_compiled_prefill(context, block, layers, ffn, rows):
    # Long enough prompts (256- to 768-slot suffixes) that the prefill's own buffers (grid
    # cache, mask, attention scores, MLP) dominate its program's temporaries, as at 8K tokens.
    s = tiny_settings(1, 1, 1, num_layers=layers, intermediate_size=ffn).with_values(
        {"agent.max_context_tokens": context, "sampler.prefill_query_block": block, "sampler.batch_size": rows})
    plan = planner.plan_memory(s)
    call = plan.sampler_call
    assert call.suffix >= 256
    # The planner plans the accelerators' path (GPU/TPU: the whole batch at once, in query blocks).
    _, _, temp = run_real_sampler(s, call, attention_by_row=False)
    want = plan.row("prefill activations").bytes
    # XLA CPU's buffer assignment keeps 3 to 5 [rows, T, F] buffers in the MLP depending on the
    # shape, so the estimate's ratio to it ranges 0.86-1.31 over these shapes (docs/scale_out.md).
    assert 0.8 < want / temp < 1.35, f"planned {want}, the compiled prefill holds {temp} temporary bytes"
    # On CPU the attention goes one row at a time as well: never more than the planned form.
    _, _, temp_cpu = run_real_sampler(s, call)
    assert temp_cpu <= 1.01 * temp


@pytest.mark.parametrize("ffn, context", [(256, 400), (256, 800)])
def test_prefill_row_on_a_sharded_sampler_mesh(ffn, context):
    # Rows over 4 fsdp shards, heads over tp=2: the per-device estimate against the compiled
    # SPMD program's per-device temporaries (8 rows per device).
    s = tiny_settings(1, 4, 2, intermediate_size=ffn).with_values(
        {"agent.max_context_tokens": context, "sampler.batch_size": 32})
    plan = planner.plan_memory(s)
    assert plan.sampler_call.mesh == (1, 4, 2)
    _, _, temp = run_real_sampler(s, plan.sampler_call, attention_by_row=False)
    assert 0.8 < plan.row("prefill activations").bytes / temp < 1.35


def test_query_blocks_shrink_the_prefill_row():
    s = load_settings(os.path.join(ROOT, "configs", "recipe.py:qwen2_5_3b,h100_8"))
    blocked = planner.plan_memory(s).row("prefill activations").bytes
    whole = planner.plan_memory(s.with_values({"sampler.prefill_query_block": 0})).row("prefill activations").bytes
    assert blocked < whole / 4


def test_tensor_parallelism_across_hosts_is_refused():
    s = tiny_settings(1, 1, 8).with_values({"hardware.device_kind": "TPU v5 lite", "hardware.num_devices": 8,
                                            "hardware.hosts": 2, "hardware.device_memory_gib": 16.0})
    with pytest.raises(planner.PlanError, match="mesh.tp=8 does not divide the 4 devices of one host"):
        planner.plan_memory(s)
    s = s.with_values({"mesh.fsdp": 2, "mesh.tp": 4, "rl.batch_questions": 3})
    with pytest.raises(planner.PlanError, match="multiple of the 2 hosts"):
        planner.plan_memory(s)


def test_unsharded_params_are_num_params_times_itemsize():
    s = load_settings(os.path.join(ROOT, "configs", "memsearcher_qwen2_5_3b.py"))
    plan = planner.plan_memory(s.with_values({"mesh.data": 1, "mesh.fsdp": 1, "mesh.tp": 1}))
    n = ModelConfig.qwen2_5_3b().num_params()
    assert plan.model_name == "qwen2_5_3b" or "3085" in plan.model_name
    assert plan.row("params").bytes == 4 * n
    assert plan.row("optimizer state").bytes == 8 * n
    # One device: the layouts agree, yet the Sampler slices its own per-layer copy, in bf16.
    assert plan.row("sampler weights").bytes == 2 * n
    assert plan.row("sampler refresh").bytes == 2 * n


def test_more_sharding_never_costs_more_per_device():
    one = planner.plan_memory(tiny_settings(1, 1, 1))
    eight = planner.plan_memory(tiny_settings(1, 4, 2))
    for name in ("params", "optimizer state", "KV cache", "train activations", "loss logits"):
        assert eight.row(name).bytes < one.row(name).bytes, name
    assert eight.total_bytes < one.total_bytes


def test_remat_lowers_the_activation_estimate():
    s = tiny_settings(num_layers=8)
    no = planner.plan_memory(s).row("train activations").bytes
    yes = planner.plan_memory(s.with_values({"model.remat": True})).row("train activations").bytes
    assert yes < no / 2


def test_total_is_persistent_plus_the_largest_phase():
    plan = planner.plan_memory(tiny_settings(1, 4, 2))
    phases = {p: plan.phase_bytes(p) for p in planner.PHASES}
    assert plan.total_bytes == plan.phase_bytes("persistent") + max(phases.values())
    assert plan.total_bytes < sum(r.bytes for r in plan.rows)


def test_check_fits_raises_with_the_table_and_passes_with_room():
    s = tiny_settings(1, 4, 2)
    with pytest.raises(planner.PlanError) as err:
        planner.check_fits(s, device_memory_gib=1e-4)
    msg = str(err.value)
    assert "does not fit" in msg and "KV cache" in msg and "fits: NO" in msg
    plan = planner.check_fits(s, device_memory_gib=64)
    assert plan.fits is True
    s = s.with_values({"hardware.device_kind": "cpu", "hardware.num_devices": 8, "hardware.device_memory_gib": 1e-4})
    with pytest.raises(planner.PlanError, match="does not fit"):
        planner.check_fits(s)
    # No capacity anywhere: nothing to check against, so it passes.
    assert planner.check_fits(tiny_settings(1, 4, 2)).fits is None


def test_cpu_host_memory_warning_names_the_peak_and_the_knobs():
    """No device memory set on CPU: the plan (per device, times the mesh's devices, which share the
    host) is held against the host's memory; a warning when over 90% of it, silence otherwise, on
    other backends, or where check_fits has a capacity to refuse against."""
    plan = planner.plan_memory(tiny_settings(1, 4, 2))
    need = plan.total_bytes * 8
    msg = planner.host_memory_warning(plan, "cpu", host_bytes=need)  # need > 90% of the host
    assert msg is not None and f"{need / planner.GIB:.1f} GiB" in msg and plan.peak_phase in msg
    assert "rl.micro_batch_size" in msg and "agent.max_context_tokens" in msg
    assert planner.host_memory_warning(plan, "cpu", host_bytes=2 * need) is None
    assert planner.host_memory_warning(plan, "gpu", host_bytes=need) is None
    assert planner.host_memory_warning(plan, "cpu", host_bytes=None) is None
    sized = planner.plan_memory(tiny_settings(1, 4, 2), device_memory_gib=64)
    assert planner.host_memory_warning(sized, "cpu", host_bytes=need) is None
    assert planner.host_memory_bytes() > 2**30  # this machine says


def test_the_training_check_logs_the_host_warning(capsys, monkeypatch):
    from memsearcher_jax.rules import config_rules
    s = tiny_settings(1, 4, 2)
    need = planner.plan_memory(s).total_bytes * 8  # the mesh's 8 CPU devices share the host
    # Over the host, but within machine_rules.HOST_REFUSAL_FACTOR of it: a warning (further over: refused).
    monkeypatch.setattr(planner, "host_memory_bytes", lambda: need // 2)
    config_rules.check_config(s)
    assert "over this host's" in capsys.readouterr().out
    config_rules.check_config(s, training=False)  # evaluation plans nothing
    assert "over this host's" not in capsys.readouterr().out
    monkeypatch.setattr(planner, "host_memory_bytes", lambda: 2**50)
    config_rules.check_config(s)
    assert "over this host's" not in capsys.readouterr().out


def test_accelerator_memory_warning_holds_the_plan_against_the_device_limit():
    """No device memory set on a GPU or TPU: the plan per device against what the runtime lets JAX
    allocate; a warning naming the peak, the limit and the settings when over it, silence at or
    under it, on CPU (the host check's job), without a limit, or with a configured capacity."""
    plan = planner.plan_memory(tiny_settings(1, 4, 2))
    limit = plan.total_bytes - 1
    msg = planner.device_memory_warning(plan, "gpu", device_bytes=limit)
    assert msg is not None and plan.peak_phase in msg and f"{limit / planner.GIB:.1f} GiB this gpu device" in msg
    assert "mesh.fsdp" in msg and "rl.micro_batch_size" in msg and "agent.max_context_tokens" in msg
    assert planner.device_memory_warning(plan, "tpu", device_bytes=plan.total_bytes) is None
    assert planner.device_memory_warning(plan, "cpu", device_bytes=limit) is None
    assert planner.device_memory_warning(plan, "gpu", device_bytes=None) is None
    sized = planner.plan_memory(tiny_settings(1, 4, 2), device_memory_gib=64)
    assert planner.device_memory_warning(sized, "gpu", device_bytes=limit) is None
    assert planner.device_memory_bytes() is None  # the CPU backend reports no limit


def test_the_training_check_on_an_accelerator_logs_the_device_warning(capsys, monkeypatch):
    from memsearcher_jax.rules import config_rules
    s = tiny_settings(1, 4, 2)
    monkeypatch.setattr(planner.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(planner, "device_memory_bytes", lambda: 1024)
    monkeypatch.setattr(planner, "host_memory_bytes", lambda: 1024)  # never asked off CPU
    config_rules.check_config(s)
    out = capsys.readouterr().out
    assert "this gpu device lets JAX allocate" in out and "over this host's" not in out
    monkeypatch.setattr(planner, "device_memory_bytes", lambda: 2**50)
    config_rules.check_config(s)
    assert "warning" not in capsys.readouterr().out


def test_mesh_and_hardware_disagree_is_an_error():
    s = tiny_settings(1, 4, 2).with_values({"hardware.device_kind": "TPU v5e", "hardware.num_devices": 64,
                                            "hardware.device_memory_gib": 16.0})
    with pytest.raises(planner.PlanError, match="hardware.num_devices is 64"):
        planner.plan_memory(s)


def test_unplannable_source_names_the_key():
    s = tiny_settings()
    with pytest.raises(planner.PlanError, match="model.source='/nowhere/custom-model'"):
        planner.plan_memory(s.with_values({"model.source": "/nowhere/custom-model"}))
    # A preset is inferred from the directory name.
    inferred = s.with_values({"model.source": "/nowhere/Qwen2.5-7B-Instruct"})
    assert planner.model_config_for_plan(inferred).hidden_size == 3584


def test_main_prints_the_table_and_exit_code(capsys):
    s = tiny_settings(1, 4, 2)
    assert planner.main(s, SimpleNamespace(device_memory_gib=64.0)) == 0
    out = capsys.readouterr().out
    assert "mesh data=1 fsdp=4 tp=2" in out and "fits: yes" in out
    assert planner.main(s, SimpleNamespace(device_memory_gib=1e-4)) == 1
    out = capsys.readouterr().out
    assert "fits: NO" in out
    assert "memsearcher-jax plan: config does not fit: needs" in out and "model.lora_rank" in out


def test_plan_on_an_accelerator_without_a_capacity_holds_the_table_against_the_runtime(capsys, monkeypatch):
    """`plan` with no capacity configured: on a GPU or TPU the table's total against the runtime's
    allocation limit (a line; the exit stays 0, as for an unknown capacity); nothing on CPU, without
    a limit, or where a capacity gives the table's own verdict."""
    s = tiny_settings(1, 4, 2)
    plan = planner.plan_memory(s)
    line = planner.runtime_limit_line(plan, "gpu", device_bytes=2 * plan.total_bytes)
    assert line is not None and "50% of it, under it" in line and "this gpu device" in line
    assert "OVER it" in planner.runtime_limit_line(plan, "tpu", device_bytes=plan.total_bytes - 1)
    assert planner.runtime_limit_line(plan, "cpu", device_bytes=2**40) is None
    assert planner.runtime_limit_line(plan, "gpu", device_bytes=None) is None
    assert planner.runtime_limit_line(planner.plan_memory(s, device_memory_gib=64), "gpu", 2**40) is None
    monkeypatch.setattr(planner.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(planner, "device_memory_bytes", lambda: plan.total_bytes - 1)
    assert planner.main(s, SimpleNamespace(device_memory_gib=None)) == 0
    out = capsys.readouterr().out
    assert "capacity: unknown" in out and "this gpu device lets JAX allocate" in out and "OVER it" in out
    assert planner.main(s, SimpleNamespace(device_memory_gib=64.0)) == 0  # configured: the verdict only
    out = capsys.readouterr().out
    assert "fits: yes" in out and "lets JAX allocate" not in out


def test_cli_plan_subcommand(capsys):
    from memsearcher_jax.cli import main as cli_main

    # The recipe with all 1280 rows in one sampler call: its cache and prefill are hundreds of
    # GiB per device; 8 rows per call (a --config override) fit in 500 GiB.
    recipe = os.path.join(ROOT, "configs", "memsearcher_qwen2_5_3b.py")
    assert cli_main(["plan", "--config", recipe, "--device-memory-gib", "500"]) == 1
    assert "fits: NO" in capsys.readouterr().out
    assert cli_main(["plan", "--config", recipe, "--device-memory-gib", "500", "--config.sampler.batch_size=8"]) == 0
    assert "fits: yes" in capsys.readouterr().out


def test_cli_plan_refuses_what_training_refuses_but_not_missing_files(capsys, tmp_path):
    """`plan` asks the training config's rules before the table (a group of 1 has no advantage; a
    bad reward spec), every problem in one message, exit 2; but not the data's files, which the
    planning machine need not hold."""
    from memsearcher_jax.cli import main as cli_main

    recipe = os.path.join(ROOT, "configs", "memsearcher_qwen2_5_3b.py")
    ok = [f"--config.data.train_path={tmp_path}/absent", "--config.sampler.batch_size=8", "--device-memory-gib", "500"]
    assert cli_main(["plan", "--config", recipe, *ok]) == 0
    assert "fits: yes" in capsys.readouterr().out
    code = cli_main(["plan", "--config", recipe, *ok, "--config.rl.group_size=1", "--config.rl.reward_fn=nowhere:fn"])
    captured = capsys.readouterr()
    assert code == 2
    assert "fits:" not in captured.out  # refused before the table
    said = captured.out + captured.err
    assert "rl.group_size=1" in said and "rl.reward_fn" in said


@pytest.mark.parametrize("path", RECIPES, ids=[f"{m},{p}" for m, p in PAIRS])
def test_every_recipe_fits(path, capsys):
    from memsearcher_jax.cli import main as cli_main

    s = load_settings(path)
    plan = planner.plan_memory(s)
    hw = s.hardware
    assert plan.capacity_bytes == int(hw.device_memory_gib * planner.GIB * hw.usable_fraction)
    # A recipe that cannot run is a defect: every one plans as fitting (LoRA where full fine-tuning cannot).
    assert plan.fits is True, f"{path.rsplit(':', 1)[1]}:\n{plan.table()}"
    assert s.rl.batch_questions == 256 and s.rl.group_size == 5
    assert cli_main(["plan", "--config", path]) == 0
    assert "fits: yes" in capsys.readouterr().out


def test_recipes_cover_every_model_and_pod():
    for model in ("3b", "7b", "14b"):
        for pod in ("v4_32", "v5e_64", "v5p_128", "h100_8"):
            assert (f"qwen2_5_{model}", pod) in PAIRS, f"missing recipe for {model} on {pod}"
            assert load_settings(f"{RECIPE}:qwen2_5_{model},{pod}").hardware.num_devices > 0


def test_scale_out_page_shows_the_planners_current_tables():
    # docs/scale_out.md quotes `plan --config X` output; it must be what the planner prints now.
    import re

    page = open(os.path.join(ROOT, "docs", "scale_out.md")).read()
    quoted = re.findall(r"plan --config (configs/\S+\.py(?::\S+)?)\n\n```\n(memory plan:.*?)\n```", page, flags=re.S)
    assert {p for p, _ in quoted} == {"configs/recipe.py:qwen2_5_3b,v5e_64", "configs/recipe.py:qwen2_5_3b,h100_8",
                                      "configs/recipe.py:qwen2_5_14b,v5e_64"}
    for path, table in quoted:
        assert table == planner.plan_memory(load_settings(os.path.join(ROOT, path))).table(), path


@pytest.mark.slow
def test_plan_check_compares_the_rollout_rows(capsys, monkeypatch):
    from memsearcher_jax.app.plan_check import main as plan_check

    s = tiny_settings(1, 1, 1).with_values({"agent.max_context_tokens": 400})
    rows = {name: (want, got) for name, want, got in compare(s, rows=4)}
    assert set(rows) == {"sampler weights", "KV cache", "prefill activations"}
    assert rows["KV cache"][0] == rows["KV cache"][1] and rows["sampler weights"][0] == rows["sampler weights"][1]
    args = ["--config", os.path.join(ROOT, "configs", "default.py"), "--rows", "4", "--config.model.source=init",
            "--config.model.hidden_size=64", "--config.model.num_layers=2", "--config.agent.max_context_tokens=400"]
    # CPU's own prefill goes row by row, far below the accelerators' plan: reported, not failed.
    assert plan_check(args) == 0
    assert "over (safe" in capsys.readouterr().out
    # The accelerators' form, which the plan describes, is inside the calibrated band.
    assert plan_check(args + ["--whole-batch-attention"]) == 0
    out = capsys.readouterr().out
    assert out.count("  ok") == 3 and "UNDER" not in out
    # A plan short of what the devices hold fails: here a planner that halves its prefill row.
    real = planner.plan_memory

    def short(s, *a, **k):
        plan = real(s, *a, **k)
        rows = tuple(dataclasses.replace(r, bytes=r.bytes // 2) if r.name == "prefill activations" else r
                     for r in plan.rows)
        return dataclasses.replace(plan, rows=rows)

    monkeypatch.setattr(planner, "plan_memory", short)
    assert plan_check(args + ["--whole-batch-attention"]) == 1
    assert "UNDER" in capsys.readouterr().out


@pytest.mark.parametrize("mesh_shape, model", [((1, 4, 2), {}), ((2, 2, 2), {}), ((1, 8, 1), dict(dtype="bfloat16")),
                                               ((1, 4, 2), dict(hidden_size=128, intermediate_size=512))])
def test_lora_plan_matches_live_arrays_and_the_compiled_refresh(mesh_shape, model):
    # LoRA: the frozen base, the adapters (+ the zero copy that scores the reference), their AdamW
    # moments and the layer_by_layer Sampler's merged copy, measured on live sharded arrays.
    s = tiny_settings(*mesh_shape, lora_rank=4, **model)
    plan = planner.plan_memory(s)
    with pytest.raises(KeyError):
        plan.row("reference params")  # the base is the reference: no copy
    mc = planner.model_config_for_plan(s)
    mesh = make_mesh(*mesh_shape, devices=jax.devices()[:8])
    learner = GRPOLearner(shard_model(Qwen2(mc, rngs=nnx.Rngs(0)), mesh, ShardingConfig.training()),
                          GRPOConfig(logprob_batch_size=16, min_seq_len=64), mesh=mesh)
    policy = learner.model()
    sampler = Sampler(policy, cache_dtype=jnp.float32, mesh=mesh, layer_by_layer=True)
    measured = {"params": per_device_bytes(learner.frozen),
                "LoRA adapters": per_device_bytes(learner.params) + per_device_bytes(learner.ref_params),
                "optimizer state": per_device_bytes(learner.opt_state),
                "sampler weights": per_device_bytes(sampler._params)}
    for name, got in measured.items():
        assert abs(plan.row(name).bytes - got) <= 16, (name, plan.row(name).bytes, got)  # AdamW's step counts aside
    # The refresh: what the largest piece's compiled program holds beyond the old arrays (its
    # temporaries and its new arrays). XLA CPU's buffer assignment: the plan is 1.0-1.2x of it.
    layer_fn, head_fn, _ = next(iter(sampler._piece_fns.values()))
    held = []
    for compiled in (layer_fn.lower(policy.layers.stacked(), np.int32(0)).compile(),
                     head_fn.lower(policy.embed[...], policy.final_norm[...]).compile()):
        ma = compiled.memory_analysis()
        held.append(ma.temp_size_in_bytes + ma.output_size_in_bytes)
    assert 1.0 <= plan.row("sampler refresh").bytes / max(held) < 1.2, (plan.row("sampler refresh").bytes, held)


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_no_reference_is_planned_without_a_kl_term(lora_rank):
    """rl.kl_coef=0: the learner keeps no reference (no copy of the weights; with LoRA no zero
    adapters), so the plan counts none, as the live learner holds none."""
    from memsearcher_jax.rules.config_rules import grpo_config

    with_kl = tiny_settings(1, 4, 2, lora_rank=lora_rank)
    without = with_kl.with_values({"rl.kl_coef": 0.0})
    plan_kl, plan = planner.plan_memory(with_kl), planner.plan_memory(without)
    mc = planner.model_config_for_plan(without)
    mesh = make_mesh(1, 4, 2, devices=jax.devices()[:8])
    model = shard_model(Qwen2(mc, rngs=nnx.Rngs(0)), mesh, ShardingConfig.training())
    learner = GRPOLearner(model, grpo_config(without), mesh=mesh)  # as the trainer builds it
    if lora_rank:  # the reference is the frozen base: the adapters' zero copy is the reference's part
        saved = plan_kl.row("LoRA adapters").bytes - plan.row("LoRA adapters").bytes
        assert saved == per_device_bytes(learner.params) > 0
    else:
        saved = plan_kl.row("reference params").bytes
        assert plan.row("reference params").bytes == 0 and saved == per_device_bytes(learner.params) > 0
    assert per_device_bytes(learner.ref_params) == 0
    assert plan_kl.phase_bytes("persistent") - plan.phase_bytes("persistent") == saved


def test_logits_chunk_shrinks_the_loss_logits_rows():
    s = tiny_settings(1, 4, 2).with_values({"agent.max_context_tokens": 400})
    whole = planner.plan_memory(s)
    chunked = planner.plan_memory(s.with_values({"rl.logits_chunk": 64}))
    seq = int(whole.row("loss logits").note.split(", ")[1])
    assert chunked.row("loss logits").bytes * seq == whole.row("loss logits").bytes * 64
    assert chunked.row("log-prob activations").bytes < whole.row("log-prob activations").bytes


@pytest.mark.parametrize("model, pod", [pair for pair in PAIRS if load_config_module(RECIPE).RECIPES[pair].lora_rank],
                         ids=lambda x: x)
def test_lora_recipes_are_the_ones_full_fine_tuning_cannot_fit(model, pod):
    s = load_settings(f"{RECIPE}:{model},{pod}")
    assert s.model.lora_rank > 0 and "LoRA" in load_config_module(RECIPE).RECIPES[(model, pod)].why
    assert planner.plan_memory(s).fits is True
    full = load_settings(f"{RECIPE}:{model},{pod}", [("model.lora_rank", "0"), ("model.param_dtype", "float32"),
                                                     ("sampler.batch_size", "1")])
    assert planner.plan_memory(full).fits is False


@pytest.mark.parametrize("workflow", ["memsearcher", "react", "mem1", "memory_ops"])
def test_the_longest_row_counts_every_observation_a_row_holds(workflow, capsys):
    """Issue 82 item 13: the planner's longest row follows from the agent's caps (prompt, then each act,
    observation and second call of one conversation; tests/test_workflows.py holds real rows to it):
    one more token of observation cap is one more token of row per observation the row holds (react:
    every turn's; mem1: the one its prompt carries), and a cap that lets a row outgrow rl.max_seq_len
    is refused before any work, naming both keys, where training once stopped mid-way."""
    from memsearcher_jax.cli import main as cli_main
    from memsearcher_jax.plan.memory_estimates import conversation_tokens

    s = load_settings(os.path.join(ROOT, "configs", "default.py"), [("agent.workflow", workflow)])
    # No budget stops a row first.
    s = s.with_values({"agent.max_context_tokens": 8192, "agent.max_response_tokens": 8192})
    before = conversation_tokens(s)
    s = s.with_values({"agent.max_observation_tokens": s.agent.max_observation_tokens + 100})
    per_row = {"react": s.agent.max_turns}.get(workflow, 1)
    assert conversation_tokens(s) - before == 100 * per_row
    s = s.with_values({"rl.max_seq_len": conversation_tokens(s)})
    planner.plan_memory(s)  # a row as long as rl.max_seq_len is allowed
    with pytest.raises(planner.PlanError, match="rl.max_seq_len=.* below the longest conversation .*"
                                                "agent.max_observation_tokens"):
        planner.plan_memory(s.with_values({"rl.max_seq_len": s.rl.max_seq_len - 1}))
    args = ["plan", "--config", os.path.join(ROOT, "configs", "default.py"), f"--config.agent.workflow={workflow}",
            "--config.rl.max_seq_len=512"]
    assert cli_main(args) == 2 and "rl.max_seq_len=512 is below the longest conversation" in capsys.readouterr().out


def test_the_recipes_caps_keep_their_planned_rows():
    """The recipes' observation caps are what a conversation leaves after its prompt, act and update:
    their longest rows (and so their plans, docs/scale_out.md's tables) stay min(context, prompt +
    response), what they were before observations were counted."""
    from memsearcher_jax.plan.memory_estimates import conversation_tokens, prompt_tokens

    for path in [*RECIPES, os.path.join(ROOT, "configs", "memsearcher_qwen2_5_3b.py")]:
        s = load_settings(path)
        a = s.agent
        assert a.max_observation_tokens >= 1536 and a.max_searches_per_act == 3
        assert conversation_tokens(s) == min(a.max_context_tokens, prompt_tokens(s) + a.max_response_tokens), path
