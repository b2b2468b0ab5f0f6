"""Per-device memory plan for a training config: will it fit before anything is compiled?

Every figure is bytes on ONE device. Parameter-shaped rows are exact: they walk the model's
abstract parameter tree (`nnx.eval_shape`, nothing allocated) and apply the same
`ShardingConfig` + `fit_spec` rules that place the live arrays, so a dimension the mesh does
not divide is counted as replicated, just as it is placed. Activation rows are estimates.
This file adds the rows up and gives the verdict; memory_estimates.py sizes each row.

The phases never overlap in time, so the total is NOT the sum of all rows:

    persistent  params, reference params (none at rl.kl_coef 0), AdamW moments, the Sampler's own per-layer copy of
                the weights (TP-only layout; always a copy, even where the layouts agree)
    rollout     + KV cache and prefill activations of the largest sampler call, shaped as the
                  Sampler pads it (`sampler_call`): rows up to the batch bucket, slots up to
                  the prompt and budget buckets, on the sampler's mesh (host-local on a pod)
    scoring     + forward activations of one log-prob chunk (logprob_batch_size rows)
    update      + gradients (accumulator and one micro-batch's) + the optimizer's update
                  tree (params and moments are donated, so they are updated in place)
                  + activations of one micro-batch
    refresh     + after the update: the weights re-laid out for sampling and the Sampler's new
                  per-layer copy, built while the old one is still held (`update_params`)
    total = persistent + max(rollout, scoring, update, refresh)

LoRA (model.lora_rank > 0) changes the rows: "params" is the frozen base (also the KL
reference: there is no reference row), "LoRA adapters" the float32 adapters and the zero copy
that scores the reference, the optimizer state, gradients and update temporaries cover the
adapters alone, and the sampler refresh is one piece (a layer, the head) at a time, since a
LoRA trainer's Sampler rebuilds its merged copy layer by layer in place.

    memsearcher-jax plan --config configs/recipe.py:qwen2_5_3b,v5e_64
"""
from __future__ import annotations

import dataclasses
import math
import os

import jax

from memsearcher_jax.plan.memory_estimates import (
    GIB,
    ITEMSIZE,
    REAL_PRESETS,
    PlanError,
    PlanRow,
    SamplerCall,
    Sizing,
    capacity_bytes,
    conversation_tokens,
    lora_fields,
    mesh_shape,
    model_config_for_plan,
    persistent_rows,
    refresh_row,
    rollout_rows,
    row_bound_problem,
    sampler_calls,
    training_rows,
    turn_loop_buckets,
    weight_elements,
)
from memsearcher_jax.runtime.console import log
from memsearcher_jax.settings import Settings

# The planner's face: the plan and its verdict (here), and the shapes it plans for that callers
# name as the planner's (memory_estimates, which sizes every row).
__all__ = ["GIB", "PHASES", "MemoryPlan", "PlanError", "PlanRow", "SamplerCall", "check_fits", "conversation_tokens",
           "host_memory_bytes", "host_memory_warning", "lora_fields", "main", "model_config_for_plan", "plan_memory",
           "sampler_calls", "turn_loop_buckets", "why_not"]

PHASES = ("rollout", "scoring", "update", "refresh")  # never overlap in time; see the module docstring


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    rows: tuple[PlanRow, ...]
    mesh: tuple[int, int, int]            # (data, fsdp, tp)
    capacity_bytes: int | None            # usable bytes per device (None: unknown)
    device_kind: str
    model_name: str
    sampler_call: SamplerCall | None = None  # the rollout call the rollout rows are sized for

    def phase_bytes(self, phase: str) -> int:
        return sum(r.bytes for r in self.rows if r.phase == phase)

    @property
    def peak_phase(self) -> str:
        return max(PHASES, key=self.phase_bytes)

    @property
    def total_bytes(self) -> int:
        return self.phase_bytes("persistent") + self.phase_bytes(self.peak_phase)

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_bytes is None else self.total_bytes <= self.capacity_bytes

    def row(self, name: str) -> PlanRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no plan row {name!r}; rows: {[r.name for r in self.rows]}")

    def table(self) -> str:
        d, f, t = self.mesh
        lines = [f"memory plan: {self.model_name} on {d * f * t} x {self.device_kind} "
                 f"(mesh data={d} fsdp={f} tp={t}); bytes per device",
                 f"  {'item':<28} {'phase':<11} {'GiB':>9}  note"]
        for r in self.rows:
            lines.append(f"  {r.name:<28} {r.phase:<11} {r.bytes / GIB:>9.3f}  {r.note}")
        lines.append(f"  {'persistent':<28} {'':<11} {self.phase_bytes('persistent') / GIB:>9.3f}")
        for ph in PHASES:
            lines.append(f"  {'+ ' + ph + ' peak':<28} {'':<11} {self.phase_bytes(ph) / GIB:>9.3f}")
        lines.append(f"  {'TOTAL (peak: ' + self.peak_phase + ')':<28} {'':<11} {self.total_bytes / GIB:>9.3f}")
        if self.capacity_bytes is None:
            lines.append("  capacity: unknown (set hardware.device_memory_gib or --device-memory-gib)")
        else:
            verdict = "yes" if self.fits else "NO"
            lines.append(f"  {'capacity (usable)':<28} {'':<11} {self.capacity_bytes / GIB:>9.3f}")
            lines.append(f"  fits: {verdict} ({100 * self.total_bytes / self.capacity_bytes:.0f}% of usable)")
        return "\n".join(lines)


def plan_memory(s: Settings, device_memory_gib: float | None = None,
                vocab_size: int | None = None) -> MemoryPlan:
    """Per-device memory table for training `s` on mesh s.mesh (see the module docstring):
    the persistent rows, then each phase's rows, in the order the table prints them."""
    mesh = mesh_shape(s)
    n_dev = math.prod(mesh)
    hw = s.hardware
    if hw is not None and hw.num_devices and int(hw.num_devices) != n_dev:
        raise PlanError(f"mesh data={mesh[0]} x fsdp={mesh[1]} x tp={mesh[2]} = {n_dev} devices, but "
                        f"hardware.num_devices is {hw.num_devices}")
    if problem := row_bound_problem(s):  # a row the learner would refuse mid-training
        raise PlanError(problem)
    mc = model_config_for_plan(s, vocab_size)
    sz = Sizing(mc=mc, mesh=mesh, pbytes=ITEMSIZE[mc.param_dtype], abytes=ITEMSIZE[mc.dtype],
                 cbytes=ITEMSIZE[str(s.sampler.cache_dtype)])
    w = weight_elements(mc, mesh)
    call, rollout = rollout_rows(s, sz)
    reference = float(s.rl.kl_coef) != 0  # kl_coef 0: the learner keeps no reference
    rows = persistent_rows(sz, w, reference) + rollout + training_rows(s, sz, w) + [refresh_row(sz, w)]
    name = s.model.preset if str(s.model.preset) in REAL_PRESETS else f"{mc.num_params() / 1e6:.1f}M-param model"
    kind = (hw.device_kind if hw else None) or "device"
    return MemoryPlan(rows=tuple(rows), mesh=mesh, capacity_bytes=capacity_bytes(s, device_memory_gib),
                      device_kind=str(kind), model_name=str(name), sampler_call=call)


def why_not(plan: MemoryPlan) -> str:
    """The reason a plan that does not fit gives: how much over, in which phase, and what to change."""
    over = plan.total_bytes - plan.capacity_bytes
    return (f"config does not fit: needs {plan.total_bytes / GIB:.2f} GiB per device (peak: {plan.peak_phase}), "
            f"{over / GIB:.2f} GiB over the usable {plan.capacity_bytes / GIB:.2f} GiB. " + why_not_settings(plan))


def why_not_settings(plan: MemoryPlan) -> str:
    """The settings that shrink a plan per device (LoRA named only when the plan does not use it)."""
    lora = any(r.name == "LoRA adapters" for r in plan.rows)
    return ("Shard more (mesh.fsdp / mesh.tp), lower rl.micro_batch_size, rl.logprob_batch_size or "
            "sampler.batch_size, enable model.remat, chunk the loss's logits (rl.logits_chunk), "
            + ("" if lora else "train LoRA adapters instead of every weight (model.lora_rank), ")
            + "or shorten agent.max_context_tokens.")


def host_memory_bytes() -> int | None:
    """This host's physical memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def host_memory_warning(plan: MemoryPlan, backend: str, host_bytes: int | None) -> str | None:
    """On CPU, where no device memory is configured: the plan against this host's memory, which
    every CPU device of the mesh shares. check_fits cannot refuse there (the capacity is unknown),
    and a step that outgrows the host is ended by the kernel's OOM killer, with no message and no
    checkpoint; so say beforehand when the plan's peak (conversations as long as
    agent.max_context_tokens) is over it. A warning, not a refusal: the plan is the worst case."""
    if plan.capacity_bytes is not None or backend != "cpu" or not host_bytes:
        return None
    need = plan.total_bytes * math.prod(plan.mesh)
    if need <= host_bytes * 0.9:
        return None
    return (f"warning: the memory plan's peak ({plan.peak_phase}) is {need / GIB:.1f} GiB, over this host's "
            f"{host_bytes / GIB:.1f} GiB: a step whose conversations grow toward agent.max_context_tokens may be "
            "killed by the OS (no checkpoint of that step). Lower rl.micro_batch_size or rl.logprob_batch_size, "
            "chunk the loss's logits (rl.logits_chunk), enable model.remat, or shorten agent.max_context_tokens; "
            "`memsearcher-jax plan --device-memory-gib N` shows the table.")


def device_memory_bytes() -> int | None:
    """What JAX lets this process allocate on its first device (None on CPU, or where the runtime
    does not say)."""
    try:
        stats = jax.local_devices()[0].memory_stats()
    except Exception:  # a runtime without memory statistics
        return None
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


def device_memory_warning(plan: MemoryPlan, backend: str, device_bytes: int | None) -> str | None:
    """On an accelerator, where no device memory is configured (a config without a hardware
    section): the plan per device against what the runtime says it may allocate. A warning, not
    the refusal a configured capacity gives: the plan is the worst case, and an accelerator that
    runs out says so itself (RESOURCE_EXHAUSTED) rather than being killed."""
    if plan.capacity_bytes is not None or backend == "cpu" or not device_bytes:
        return None
    if plan.total_bytes <= device_bytes:
        return None
    return (f"warning: the memory plan's peak ({plan.peak_phase}) is {plan.total_bytes / GIB:.1f} GiB per device, "
            f"over the {device_bytes / GIB:.1f} GiB this {backend} device lets JAX allocate: a step whose "
            "conversations grow toward agent.max_context_tokens may run out of device memory. "
            + why_not_settings(plan) + " `memsearcher-jax plan --device-memory-gib N` shows the table.")


def runtime_limit_line(plan: MemoryPlan, backend: str, device_bytes: int | None) -> str | None:
    """For `plan` on an accelerator with no capacity configured: the table's total against what the
    runtime lets JAX allocate on this device (the limit the training check warns against), so the
    table is not left at "capacity: unknown" when the device can say. None on CPU, without a limit,
    or with a configured capacity (the table's own verdict then)."""
    if plan.capacity_bytes is not None or backend == "cpu" or not device_bytes:
        return None
    pct = 100 * plan.total_bytes / device_bytes
    verdict = "under it" if plan.total_bytes <= device_bytes else "OVER it (a warning; the plan is the worst case)"
    return (f"  this {backend} device lets JAX allocate {device_bytes / GIB:.3f} GiB (from the runtime): "
            f"the plan is {pct:.0f}% of it, {verdict}")


def check_fits(s: Settings, device_memory_gib: float | None = None) -> MemoryPlan:
    """Raise PlanError with the table when the plan exceeds the usable device memory.

    Unknown capacity (no hardware section, no override) passes: there is nothing to refuse against;
    the plan is then held against what the backend says instead (the host's memory on CPU,
    host_memory_warning; the device's allocation limit elsewhere, device_memory_warning) and logged
    as a warning when over it.
    """
    plan = plan_memory(s, device_memory_gib)
    if plan.fits is False:
        raise PlanError(why_not(plan) + "\n" + plan.table())
    if plan.fits is None:  # only then is the backend asked (a pod's plan has its capacity)
        backend = jax.default_backend()
        warning = (host_memory_warning(plan, backend, host_memory_bytes()) if backend == "cpu"
                   else device_memory_warning(plan, backend, device_memory_bytes()))
        if warning:
            log(warning)
    return plan


def main(s: Settings, args) -> int:
    """`memsearcher-jax plan`: print the table; exit 0 when it fits (or the capacity is unknown:
    on an accelerator the table is then held against the runtime's allocation limit, a line, not a
    verdict), 1 with the reason when it does not, 2 when it cannot plan."""
    try:
        plan = plan_memory(s, getattr(args, "device_memory_gib", None))
    except PlanError as e:
        print(f"memsearcher-jax plan: {e}")
        return 2
    print(plan.table())
    if plan.fits is None and jax.default_backend() != "cpu":
        line = runtime_limit_line(plan, jax.default_backend(), device_memory_bytes())
        if line:
            print(line)
    if plan.fits is False:
        print(f"memsearcher-jax plan: {why_not(plan)}")
        return 1
    return 0
