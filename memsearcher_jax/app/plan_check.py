"""Check the planner's rollout rows against a real Sampler call on the devices at hand.

The planner's rollout rows are estimates calibrated on XLA CPU; this runs the Sampler the
trainer would build (random weights of the planned shape, the config's cache dtype, query
block and mesh) on one call shaped like the plan's largest (`plan.sampler_call`), then reads
what XLA really holds: the live KV cache and the compiled prefill program's temporaries.

    python bench/plan_check.py --config configs/recipe.py:qwen2_5_3b,h100_8 --rows 8

`tests/test_planner.py` runs `measure_sampler_call` on CPU; on a GPU or TPU it is the check
the planner's docs ask for before trusting a recipe near its limit.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections import defaultdict

import jax
import numpy as np
from flax import nnx

from memsearcher_jax.app.experiment import build_sampler
from memsearcher_jax.models import Qwen2, ShardingConfig, make_mesh
from memsearcher_jax.models.hf_io import param_sharding
from memsearcher_jax.plan import planner
from memsearcher_jax.settings import Settings, load_settings
from memsearcher_jax.settings.config_utils import split_overrides

# The prefill row's calibrated range on XLA CPU (tests/test_planner.py): planned / measured.
LOW, HIGH = 0.8, 1.35


def per_device_bytes(tree) -> int:
    """Largest per-device total of the live shards of the arrays in `tree`."""
    held: dict = defaultdict(int)
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            for shard in leaf.addressable_shards:
                held[shard.device] += shard.data.nbytes
    return max(held.values(), default=0)


def random_model(mc, mesh):
    """A Qwen2 of config `mc` with small random weights, created shard by shard straight into
    the sampling layout on `mesh` and stored in the compute dtype (what the Sampler keeps), so
    no device ever holds the whole f32 model (14B: 59 GB)."""
    mc = dataclasses.replace(mc, param_dtype=mc.dtype)
    sharding = ShardingConfig.sampling()
    abstract = nnx.eval_shape(lambda: Qwen2(mc, rngs=nnx.Rngs(0), mesh=mesh, sharding=sharding))
    graphdef, state = nnx.split(abstract)
    flat = nnx.to_flat_state(state)
    rng = np.random.default_rng(0)
    for path_key, var in flat:
        name = ".".join(str(p) for p in path_key)
        shape, dtype = var.get_value().shape, var.get_value().dtype

        def block(index, shape=shape, dtype=dtype):
            sub = tuple(len(range(*i.indices(d))) for i, d in zip(index, shape)) if index else shape
            return (0.02 * rng.standard_normal(sub, np.float32)).astype(dtype)

        var.set_value(jax.make_array_from_callback(shape, param_sharding(name, shape, mesh, sharding), block))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


class _PrefillDone(Exception):
    """Stops a measured generate() where its decode would begin."""


def measure_sampler_call(s: Settings, call, attention_by_row: bool | None = None) -> dict:
    """Run the Sampler a trainer would build for `s` on one call shaped like `call` (a
    planner.SamplerCall): `call.rows` prompts of `call.longest_prompt` tokens sharing exactly
    `call.shared_prefix`, each with budget `call.largest_budget`, up to the end of its prefill
    (what is measured is all there; the decode loop is neither compiled nor run).

    Returns {"kv": largest per-device bytes of the cache the prefill allocated (the rows' own
    slots and the shared prefix), "kv_shape" and "prefix_shape": their per-layer shapes,
    "prefill_temp": the compiled prefill program's temporary bytes per device,
    "weights": the sampler's own weight copy per device}. attention_by_row: force the prefill
    attention's row loop on (True) or off (False, the accelerators' form); None: the Sampler's
    own choice for this platform.
    """
    mc = planner.model_config_for_plan(s)
    n = math.prod(call.mesh)
    if n > len(jax.devices()):
        raise ValueError(f"the call's sampler mesh {call.mesh} needs {n} devices; this process sees "
                         f"{len(jax.devices())}")
    mesh = make_mesh(*call.mesh, devices=jax.devices()[:n]) if n > 1 else None
    if mesh is None:  # one device: built there in the compute dtype (the Sampler keeps that)
        model = Qwen2(dataclasses.replace(mc, param_dtype=mc.dtype), rngs=nnx.Rngs(0))
    else:
        model = random_model(mc, mesh)
    sampler = build_sampler(s, model, mesh)
    if attention_by_row is not None:
        sampler._math.attention_by_row = attention_by_row
    rng = np.random.default_rng(0)
    shared = rng.integers(1, mc.vocab_size, call.shared_prefix).tolist()
    tail = call.longest_prompt - call.shared_prefix - 1
    prompts = [shared + [i + 1] + rng.integers(1, mc.vocab_size, tail).tolist() for i in range(call.rows)]
    seen: dict = {}
    prefill, decode = sampler._prefill, sampler._decode

    def spy_prefill(*args, **kwargs):
        seen["prefill"] = (args, kwargs)
        return prefill(*args, **kwargs)

    def spy_decode(params, st):  # the cache the prefill allocated, at the decode's entry
        seen["kv"] = per_device_bytes((st.cache, st.prefix))
        seen["kv_shape"], seen["prefix_shape"] = st.cache[0][0].shape, st.prefix[0][0].shape
        raise _PrefillDone  # nothing measured here needs the decode: skip its compile and its steps

    sampler._prefill, sampler._decode = spy_prefill, spy_decode
    try:
        sampler.generate(prompts, max_new_tokens=call.largest_budget, temperature=1.0, seed=1)
    except _PrefillDone:
        pass
    finally:
        sampler._prefill, sampler._decode = prefill, decode
    args, kwargs = seen["prefill"]
    temp = prefill.lower(*args, **kwargs).compile().memory_analysis().temp_size_in_bytes
    return {"kv": seen["kv"], "kv_shape": seen["kv_shape"], "prefix_shape": seen["prefix_shape"],
            "prefill_temp": int(temp),
            "weights": per_device_bytes(sampler._params)}


def compare(s: Settings, rows: int | None = None,
            attention_by_row: bool | None = None) -> list[tuple[str, int, int]]:
    """(row name, planned bytes, measured bytes) for the rollout rows and the sampler's
    weights. rows: sample this many rows per call instead of sampler.batch_size (a smaller
    call fits a smaller device; the plan is redone for it). attention_by_row: as in
    measure_sampler_call."""
    if rows:  # a copy: the caller's settings stay as they were
        s = s.with_values({"sampler.batch_size": int(rows)})
    plan = planner.plan_memory(s)
    got = measure_sampler_call(s, plan.sampler_call, attention_by_row)
    return [("sampler weights", plan.row("sampler weights").bytes, got["weights"]),
            ("KV cache", plan.row("KV cache").bytes, got["kv"]),
            ("prefill activations", plan.row("prefill activations").bytes, got["prefill_temp"])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a training config (a recipe); --config.KEY=VALUE overrides")
    ap.add_argument("--rows", type=int, default=0, help="rows per sampler call (default: sampler.batch_size)")
    ap.add_argument("--whole-batch-attention", action="store_true",
                    help="on CPU, prefill attention over the whole batch as on GPU/TPU (the form the plan "
                         "describes) instead of the CPU's row loop, which holds less")
    rest, overrides = split_overrides(list(argv) if argv is not None else sys.argv[1:])
    args = ap.parse_args(rest)
    settings = load_settings(args.config, overrides)
    print(f"devices: {len(jax.devices())} x {jax.devices()[0].device_kind}")
    print(f"{'row':<22}{'planned GiB':>13}{'measured GiB':>14}{'planned/measured':>18}  verdict")
    under = False
    for name, want, got in compare(settings, args.rows or None, False if args.whole_batch_attention else None):
        ratio = want / got if got else float("inf")
        if ratio < LOW:
            verdict, under = "UNDER: the plan is short of what is held", True
        elif ratio > HIGH:
            verdict = "over (safe, but the recipe could hold more rows)"
        else:
            verdict = "ok"
        print(f"{name:<22}{want / 2 ** 30:>13.3f}{got / 2 ** 30:>14.3f}{ratio:>18.2f}  {verdict}")
    print(f"band: planned/measured in [{LOW}, {HIGH}] is the calibrated range; below {LOW} fails")
    return 1 if under else 0
