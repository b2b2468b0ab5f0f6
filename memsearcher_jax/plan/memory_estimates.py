"""What each row of the memory plan holds on one device (planner.py lists the rows by phase and
adds them up).

First the config read into shapes, nothing allocated: the model (`model_config_for_plan`), the
mesh and its hosts, the largest rollout call as the Sampler pads it (`sampler_calls`), the
longest training row (`conversation_tokens`). Then each row's bytes from those shapes: the
weights in their layouts (`weight_elements`, `persistent_rows`), the rollout call
(`rollout_rows`), scoring and the update (`training_rows`), the sampler's refresh (`refresh_row`).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import types
from collections.abc import Sequence

from memsearcher_jax.errors import UserInputError
from memsearcher_jax.runtime.distributed import batch_split_problems
from memsearcher_jax.settings import HardwareSettings, Settings

GIB = 1024 ** 3
REAL_PRESETS = ("qwen2_5_0_5b", "qwen2_5_1_5b", "qwen2_5_3b", "qwen2_5_7b", "qwen2_5_14b")
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
# Cache length when a config names none: prompt budget + the whole response of one call.
_PROMPT_OVERHEAD_TOKENS = 512  # system prompt + question + chat markup
_WORLD_VOCAB = 1024  # the synthetic world's tokenizer (data/world_cache.py default)



class PlanError(UserInputError):
    """The config does not fit on its devices (or cannot be planned); the message holds the table."""


@dataclasses.dataclass(frozen=True)
class PlanRow:
    name: str
    phase: str          # "persistent" or one of planner.PHASES
    bytes: int          # per device
    note: str = ""


# ----------------------------------------------------------------------------- inputs

def model_config_for_plan(s: Settings, vocab_size: int | None = None):
    """The ModelConfig the trainer would build, without loading weights or a tokenizer.

    A Hugging Face dir in model.source wins (its config.json); else a released preset in
    model.preset; else (model.source == "init") the preset overridden by the model.* fields,
    as trainer.model_config does, with vocab from model.vocab_size / `vocab_size`.
    """
    from memsearcher_jax.models import ModelConfig

    m = s.model
    common = dict(dtype=m.dtype, param_dtype=m.param_dtype, scan_layers=m.scan_layers, remat=m.remat,
                  **lora_fields(s))
    source = os.path.expanduser(str(m.source))
    if m.source != "init" and os.path.isfile(os.path.join(source, "config.json")):
        return ModelConfig.from_hf_config(source, **common)
    preset = str(m.preset).replace(".", "_").replace("-", "_").lower()
    if preset not in REAL_PRESETS and m.source != "init":
        preset = _preset_from_name(source) or preset  # e.g. ".../Qwen2.5-3B-Instruct" not downloaded yet
    if preset in REAL_PRESETS:
        return ModelConfig.from_preset(preset, **common)
    if m.source != "init":
        raise PlanError(f"cannot plan model.source={m.source!r}: it is not a local model dir with config.json and "
                        f"model.preset={m.preset!r} is not a released Qwen2.5 preset {REAL_PRESETS}")
    vocab = vocab_size or s.model.vocab_size
    if not vocab and s.world.enabled:
        vocab = _WORLD_VOCAB
    if not vocab:
        raise PlanError("model.source='init' needs the vocabulary size: set model.vocab_size in the config "
                        "(the trainer takes it from the tokenizer)")
    return ModelConfig.from_preset(
        m.preset, vocab_size=int(vocab), hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
        rope_theta=m.rope_theta, **common)


def lora_fields(s: Settings) -> dict:
    """model.lora_* as ModelConfig fields, as the trainer reads them (settings.ModelSettings.lora_fields)."""
    return s.model.lora_fields()


def _preset_from_name(path: str) -> str | None:
    match = re.search(r"qwen2[._-]5[._-](\d+(?:\.\d+)?)b", os.path.basename(path.rstrip("/")).lower())
    if not match:
        return None
    key = "qwen2_5_" + match.group(1).replace(".", "_") + "b"
    return key if key in REAL_PRESETS else None


def mesh_shape(s: Settings) -> tuple[int, int, int]:
    return int(s.mesh.data), int(s.mesh.fsdp), int(s.mesh.tp)


def _fake_mesh(mesh: tuple[int, int, int]):
    # fit_spec only reads mesh.shape, so the plan needs no devices.
    return types.SimpleNamespace(shape={"data": mesh[0], "fsdp": mesh[1], "tp": mesh[2]})


def _split(n: int, ways: int) -> int:
    """A dimension of n split `ways` ways, or whole when the mesh cannot divide it (replicated,
    as fit_spec places it)."""
    return n // ways if n % ways == 0 else n


def per_device_elems(shape: Sequence[int], spec, mesh: tuple[int, int, int]) -> int:
    """Elements of one device's shard of an array of `shape` placed with `spec` (fit to mesh)."""
    from memsearcher_jax.models.sharding import fit_spec

    fake = _fake_mesh(mesh)
    fitted = fit_spec(tuple(shape), spec, fake)
    n = 1
    for dim, axes in zip(shape, tuple(fitted) + (None,) * (len(shape) - len(fitted))):
        names = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
        n *= dim // math.prod(fake.shape[a] for a in names)
    return n


def param_shapes(model_cfg) -> dict[str, tuple[int, ...]]:
    """{"layers.q_kernel": (L, D, H, Dh), ...} from the abstract module (nothing allocated)."""
    from flax import nnx

    from memsearcher_jax.models import Qwen2

    abstract = nnx.eval_shape(lambda: Qwen2(model_cfg, rngs=nnx.Rngs(0)))
    flat = nnx.to_flat_state(nnx.state(abstract, nnx.Param))
    return {".".join(str(p) for p in k): tuple(v.get_value().shape) for k, v in flat}


def _layout_elems(shapes, mesh, sharding) -> dict[str, int]:
    from memsearcher_jax.models.sharding import param_spec

    return {n: per_device_elems(s, param_spec(n, len(s), sharding), mesh) for n, s in shapes.items()}


def _workflow(s: Settings):
    from memsearcher_jax.agent.workflows import get_workflow  # light: no JAX

    return get_workflow(s.agent.workflow)


def prompt_tokens(s: Settings) -> int:
    """Longest context a conversation starts from: system prompt + question (+ what the workflow
    carries: the memory, the bank, the last act and observation)."""
    return _PROMPT_OVERHEAD_TOKENS + _workflow(s).carried_tokens(s.agent)


def conversation_tokens(s: Settings) -> int:
    """Longest conversation (prompt + response), the training row's length before bucketing: the
    prompt, then what the workflow's turns add to one conversation, each act and second call at most
    agent.max_new_tokens and each observation at most its cap (agent.max_observation_tokens, markup
    included; `Workflow.row_tokens`). It follows from the config: a row the rollout makes is never longer."""
    return int(_workflow(s).row_tokens(s.agent, prompt_tokens(s)))


def row_bound_problem(s: Settings) -> str | None:
    """The learner refuses a conversation over rl.max_seq_len mid-training (batching.pack_rows): say so
    before any work when the config's longest row is over it."""
    limit, longest = s.rl.max_seq_len, conversation_tokens(s)
    if longest <= int(limit):
        return None
    return (f"rl.max_seq_len={limit} is below the longest conversation this agent config can make ({longest} tokens: "
            "prompt + acts, observations and second calls; memory_estimates.conversation_tokens); raise it, or lower "
            "agent.max_observation_tokens, agent.max_new_tokens or agent.max_turns (react)")


def hosts_and_local_devices(s: Settings) -> tuple[int, int]:
    """(hosts, devices per host) from the hardware section (one host when it names none)."""
    mesh = mesh_shape(s)
    n_dev = math.prod(mesh)
    hw = s.hardware
    hosts = int(hw.hosts or 1) if hw is not None else 1
    if hosts < 1 or n_dev % hosts:
        raise PlanError(f"the mesh's {n_dev} devices do not split evenly over hardware.hosts={hosts}")
    per_host = n_dev // hosts
    if hosts > 1 and per_host % mesh[2]:
        # The same rule distributed.global_mesh enforces when the job starts.
        raise PlanError(f"mesh.tp={mesh[2]} does not divide the {per_host} devices of one host "
                        f"(hardware.hosts={hosts}); tensor parallelism across hosts is not supported")
    return hosts, per_host


@dataclasses.dataclass(frozen=True)
class SamplerCall:
    """One Sampler.generate call as the Sampler pads it: per layer k, v [batch, K, suffix + new,
    Dh] for the rows' own slots and [1, K, prefix, Dh] for the shared prefix."""

    rows: int                     # live rows handed to the call
    batch: int                    # B: rows rounded up to the batch bucket (a multiple of the batch shards)
    prefix: int                   # P: shared-prefix slots (0: no shared prefix)
    suffix: int                   # T: prompt-suffix slots, also the prefill's query length
    new: int                      # N: slots for generated tokens
    mesh: tuple[int, int, int]    # the sampler's (data, fsdp, tp): host-local on a multi-host pod
    longest_prompt: int           # tokens of the call's longest prompt
    shared_prefix: int            # tokens every prompt shares that give this split (0: none)
    largest_budget: int           # the call's largest max_new_tokens

    @property
    def slots(self) -> int:
        return self.prefix + self.suffix + self.new


def sampler_rows(s: Settings, hosts: int) -> int:
    """The most rows one sampler call takes: one host's B*G / hosts, or sampler.batch_size if smaller."""
    host_rows = int(s.rl.batch_questions) // hosts * int(s.rl.group_size)
    return min(int(s.sampler.batch_size or host_rows), host_rows)


def turn_loop_buckets(s: Settings, hosts: int):
    """The Sampler's buckets for this config's turn loop (what experiment.build_sampler gives it and
    what the plan sizes): 4x steps, capped by the context limit and by the rows of one call."""
    from memsearcher_jax.sampling.buckets import BucketConfig

    rows = max(sampler_rows(s, hosts), 1)
    return BucketConfig.for_turn_loop(int(s.agent.max_new_tokens), max_prompt=int(s.agent.max_context_tokens),
                                      max_batch=rows)


def sampler_calls(s: Settings) -> list[SamplerCall]:
    """Every shape the largest rollout call can take on one host, one per prefix/suffix split.

    Rows: the trainer's sampler sees one host's B*G / hosts rows (`host_shard`), chunked by
    sampler.batch_size, on the host-local mesh (1, devices per host / tp, tp) when there are
    several hosts, else on the learner's mesh. Slots: a call's prompts are at most
    min(max_context_tokens, context + max_response_tokens) - 1 tokens (a memory-update or
    ReAct prompt carries the response so far and leaves >= 1 token of budget), its budgets at
    most min(max_new_tokens, max_response_tokens, max_context_tokens - 1); a batch whose
    prompts share a prefix of plen >= min_shared_prefix tokens is split into prefix (at most
    max_shared_prefix of them) and suffix, each rounded up to its own prompt bucket. The Sampler's
    own buckets do the rounding: `turn_loop_buckets`, what experiment.build_sampler gives it.
    """
    d, f, t = mesh_shape(s)
    hosts, per_host = hosts_and_local_devices(s)
    mesh = (1, per_host // t, t) if hosts > 1 else (d, f, t)
    split = batch_split_problems(int(s.rl.batch_questions), hosts)
    if split:
        raise PlanError(split[0])
    rows, a = sampler_rows(s, hosts), s.agent
    longest_prompt = int(min(a.max_context_tokens, prompt_tokens(s) + a.max_response_tokens)) - 1
    budget = int(min(a.max_new_tokens, a.max_response_tokens, a.max_context_tokens - 1))
    bk = turn_loop_buckets(s, hosts)
    batch = bk.batch(rows, mesh[0] * mesh[1])
    splits = {(0, bk.prompt(longest_prompt)): 0}
    if rows > 1 or bk.max_shared_prefix:  # one row splits only under a prefix cap
        for n in range(bk.min_shared_prefix, longest_prompt):
            plen = bk.prefix_tokens(n)
            splits.setdefault((bk.prompt(plen), bk.prompt(longest_prompt - plen)), plen)
    return [SamplerCall(rows, batch, p, t_, bk.new_tokens(budget), mesh, longest_prompt, n, budget)
            for (p, t_), n in sorted(splits.items())]


def capacity_bytes(s: Settings, device_memory_gib: float | None) -> int | None:
    hw = s.hardware
    gib = device_memory_gib if device_memory_gib is not None else (hw.device_memory_gib if hw else None)
    if gib is None:
        return None
    # XLA needs room for its own buffers, and on GPU the allocator is capped by
    # XLA_PYTHON_CLIENT_MEM_FRACTION: plan against the usable fraction only.
    frac = float(hw.usable_fraction) if hw else HardwareSettings().usable_fraction
    return int(float(gib) * GIB * frac)


# ----------------------------------------------------------------------------- the rows

@dataclasses.dataclass(frozen=True)
class Sizing:
    """What every row is sized from: the model, the learner's mesh, bytes per element."""

    mc: object                    # the ModelConfig
    mesh: tuple[int, int, int]    # (data, fsdp, tp)
    pbytes: int                   # parameter dtype
    abytes: int                   # compute (activation) dtype
    cbytes: int                   # KV-cache dtype


@dataclasses.dataclass(frozen=True)
class WeightElements:
    """Per-device element counts of the weights in their layouts (LoRA adapters apart)."""

    shapes: dict                  # base tensors (adapters excluded): name -> shape
    train: int                    # base weights in the training layout (FSDP+TP)
    adapters: int                 # LoRA adapters in the training layout (0 without LoRA)
    sampler: int                  # the Sampler's copy of every base tensor (TP-only layout)
    relaid: int                   # the tensors whose placement differs between the layouts
    n_relaid: int                 # how many tensors those are


def _placement(name: str, shape, sharding, fake) -> tuple:
    """The mesh axes each dimension of a parameter is split over; axes of size 1 are left out,
    since they do not change where bytes live."""
    from memsearcher_jax.models.sharding import fit_spec, param_spec

    spec = fit_spec(shape, param_spec(name, len(shape), sharding), fake)
    out = []
    for axes in spec:
        names = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
        out.append(tuple(a for a in names if fake.shape[a] > 1))
    return tuple(out)


def weight_elements(mc, mesh: tuple[int, int, int]) -> WeightElements:
    """Exact per-device element counts, walking the abstract parameter tree.

    The trainer re-lays the trained params out in the TP-only layout (a real copy only for the
    tensors whose placement differs, made in the compute dtype: shard_model(move_dtype=...)),
    then the Sampler slices that into its own per-layer arrays in the compute dtype: a full
    copy of every tensor, which it keeps. LoRA: the adapters are their own rows; every other
    row is about the base weights (the sampler's copy has the adapters merged in)."""
    from memsearcher_jax.models import ShardingConfig
    from memsearcher_jax.models.qwen2 import is_lora_name

    all_shapes = param_shapes(mc)
    shapes = {n: s for n, s in all_shapes.items() if not is_lora_name(n)}
    adapters = {n: s for n, s in all_shapes.items() if is_lora_name(n)}
    train, sampling = ShardingConfig.training(), ShardingConfig.sampling()
    samp_el = _layout_elems(shapes, mesh, sampling)
    fake = _fake_mesh(mesh)
    differs = [n for n, s in shapes.items() if _placement(n, s, train, fake) != _placement(n, s, sampling, fake)]
    return WeightElements(shapes=shapes, train=sum(_layout_elems(shapes, mesh, train).values()),
                           adapters=sum(_layout_elems(adapters, mesh, train).values()),
                           sampler=sum(samp_el.values()), relaid=sum(samp_el[n] for n in differs),
                           n_relaid=len(differs))


def persistent_rows(sz: Sizing, w: WeightElements, reference: bool = True) -> list[PlanRow]:
    """Weights, reference, optimizer state and the Sampler's copy: held for the whole run.
    reference False (rl.kl_coef 0): the learner keeps no reference, so none is counted."""
    mc = sz.mc
    sampler_note = f"the Sampler's per-layer copy of all {len(w.shapes)} tensors"
    if mc.lora:
        # The optimizer, gradients and update cover the float32 adapters alone; the frozen base is
        # the KL reference, scored with an all-zero copy of the adapters (no copy of the weights).
        return [
            PlanRow("params", "persistent", w.train * sz.pbytes,
                    f"{mc.num_params() / 1e9:.2f}B x {mc.param_dtype}, FSDP+TP, frozen base (the KL reference)"),
            PlanRow("LoRA adapters", "persistent", (2 if reference else 1) * w.adapters * 4,
                    f"{mc.num_lora_params() / 1e6:.1f}M x float32 (rank {mc.lora_rank}, "
                    f"{','.join(mc.lora_targets)})" + (" + the zero copy that scores the reference" if reference
                                                       else ", no reference (rl.kl_coef 0)")),
            PlanRow("optimizer state", "persistent", 2 * w.adapters * 4, "AdamW mu + nu of the adapters"),
            PlanRow("sampler weights", "persistent", w.sampler * sz.abytes,
                    f"{sampler_note}, adapters merged, {mc.dtype}, TP-only"),
        ]
    return [
        PlanRow("params", "persistent", w.train * sz.pbytes,
                f"{mc.num_params() / 1e9:.2f}B x {mc.param_dtype}, FSDP+TP"),
        PlanRow("reference params", "persistent", w.train * sz.pbytes if reference else 0,
                "frozen copy for the KL term" if reference else "none: rl.kl_coef is 0, no KL term reads one"),
        # optax.adamw keeps mu and nu in the parameter dtype and layout.
        PlanRow("optimizer state", "persistent", 2 * w.train * sz.pbytes, "AdamW mu + nu"),
        PlanRow("sampler weights", "persistent", w.sampler * sz.abytes, f"{sampler_note}, {mc.dtype}, TP-only"),
    ]


def sampler_call_bytes(sz: Sizing, call: SamplerCall, block: int) -> tuple[int, int, int]:
    """(KV cache bytes, prefill activation bytes, query block) of one Sampler call, per device.

    The Sampler's cache, per layer k, v [B, K, S, Dh] with the cache spec, and what its prefill
    program holds besides (sampler.py `_prefill_impl`): the packed grid's own cache (every
    layer's K/V over the prefix + suffix slots, gathered into the decode cache at the end; at
    worst one grid row per call row), the [rows, T, P + T] mask, and one layer's larger phase:
    attention (one query block's f32 scores + the softmax's temporary or the probabilities
    [rows, heads, block, P + T], and q/k/v) or the MLP (~4 [rows, T, F] buffers), plus the
    residual. Calibrated against XLA's buffer assignment for the compiled prefill on CPU:
    0.86-1.31x of what XLA holds over the 8 shapes of tests/test_planner.py (a sweep of 14 gave
    the same range)."""
    from jax.sharding import PartitionSpec as P

    from memsearcher_jax.models import ShardingConfig
    from memsearcher_jax.sampling.layers import query_block_size

    mc, abytes = sz.mc, sz.abytes
    L, D, F, H, K, Dh = mc.num_layers, mc.hidden_size, mc.intermediate_size, mc.num_heads, mc.num_kv_heads, mc.head_dim
    cs = tuple(ShardingConfig.sampling().cache)  # [L, B, S, K, Dh] -> per layer [B, K, S, Dh]
    layer_spec = P(cs[1], cs[3], cs[2], cs[4])
    # Each row's own slots, and the shared prefix once (replicated over the row shards).
    own = per_device_elems((call.batch, K, call.suffix + call.new, Dh), layer_spec, call.mesh)
    kv = 2 * L * (own + per_device_elems((1, K, call.prefix, Dh), layer_spec, call.mesh)) * sz.cbytes
    keys = call.prefix + call.suffix  # the grid's slots
    grid = 2 * L * per_device_elems((call.batch, K, keys, Dh), layer_spec, call.mesh) * sz.cbytes
    rows_loc = call.batch // (call.mesh[0] * call.mesh[1])
    h_loc, k_loc, f_loc = (_split(n, call.mesh[2]) for n in (H, K, F))
    blk = query_block_size(call.suffix, block)
    tokens = rows_loc * call.suffix
    mask = tokens * keys
    attention = rows_loc * h_loc * blk * keys * (4 + abytes) + tokens * (h_loc + 2 * k_loc) * Dh * abytes
    mlp = 4 * tokens * f_loc * abytes  # gate and up, their product, a layout copy
    return kv, grid + mask + max(attention, mlp) + tokens * D * abytes, blk


def rollout_rows(s: Settings, sz: Sizing) -> tuple[SamplerCall, list[PlanRow]]:
    """The largest rollout call (of every prefix/suffix split it may take) and its two rows."""
    from memsearcher_jax.sampling.sampler import check_query_block

    calls = sampler_calls(s)
    try:
        block = check_query_block(s.sampler.prefill_query_block)
    except ValueError as e:
        raise PlanError(f"sampler.{e}") from None
    call = max(calls, key=lambda c: sum(sampler_call_bytes(sz, c, block)[:2]))
    kv_b, prefill_b, blk = sampler_call_bytes(sz, call, block)
    on = (f"host-local mesh {'x'.join(map(str, call.mesh))}" if call.mesh != sz.mesh
          else f"{call.mesh[0] * call.mesh[1]} batch shards")
    H = sz.mc.num_heads
    h_note = f"{H}/{call.mesh[2]}" if H % call.mesh[2] == 0 else str(H)
    return call, [
        PlanRow("KV cache", "rollout", kv_b,
                f"{call.batch} rows ({call.rows} live) x (T {call.suffix} + N {call.new}) slots + "
                f"one {call.prefix}-slot prefix, {s.sampler.cache_dtype}, {on}"),
        PlanRow("prefill activations", "rollout", prefill_b,
                f"grid K/V of {call.prefix + call.suffix} slots, mask, [{call.batch // (call.mesh[0] * call.mesh[1])}, "
                f"{h_note} heads, {blk} queries, {call.prefix + call.suffix}] scores, one MLP"),
    ]


def layer_activation_bytes(sz: Sizing, rows: int, seq: int) -> int:
    """One layer's live activations while it runs (forward or its recomputation), per device."""
    mc, abytes, tp = sz.mc, sz.abytes, sz.mesh[2]
    h_loc, k_loc, f_loc = _split(mc.num_heads, tp), _split(mc.num_kv_heads, tp), _split(mc.intermediate_size, tp)
    qkv = rows * seq * (h_loc + 2 * k_loc) * mc.head_dim * abytes * 2   # pre/post rope
    scores = rows * h_loc * seq * seq * (4 + abytes)                     # f32 scores + probs
    mask = rows * seq * seq                                              # bool [B, T, S]
    mlp = 3 * rows * seq * f_loc * abytes                                # gate, up, silu*up
    resid = 4 * rows * seq * mc.hidden_size * abytes                     # x, norms, attention out
    lora = rows * seq * mc.lora_rank * len(mc.lora_targets) * abytes if mc.lora else 0  # x A per target
    return qkv + scores + mask + mlp + resid + lora


def training_rows(s: Settings, sz: Sizing, w: WeightElements) -> list[PlanRow]:
    """Scoring (old/reference log-probs) and the update, on rows of one padded conversation."""
    from memsearcher_jax.sampling.buckets import bucket

    mc, mesh, abytes = sz.mc, sz.mesh, sz.abytes
    # A training row is one conversation, padded as batching.pack_rows pads it (quarter octaves). With
    # rl.pack_rows the learner packs several into rows never wider than this (RowLayout.row_width
    # caps them at it), micro_batch_size / logprob_batch_size rows a call: the same shapes bound.
    longest = conversation_tokens(s)
    seq = bucket(longest, s.rl.min_seq_len, steps_per_octave=4)
    # rl.logits_chunk: the head's logits are made (and in the backward remade) that many positions
    # at a time, so only one chunk's are held (grpo.token_logprobs_and_entropy).
    chunk = int(s.rl.logits_chunk or 0)
    positions = min(chunk, seq) if chunk > 0 else seq

    def logits_bytes(rows: int, copies: int) -> int:  # f32, vocabulary split over tp
        return copies * rows * positions * _split(mc.vocab_size, mesh[2]) * 4

    # Rows a device holds; not divisible by the batch shards: replicated (as _put does).
    mb_t = _split(int(s.rl.micro_batch_size), mesh[0] * mesh[1])
    mb_s = _split(int(s.rl.logprob_batch_size), mesh[0] * mesh[1])
    # Scoring is a forward pass: one layer live at a time, plus logits and softmax.
    rows = [PlanRow("log-prob activations", "scoring", layer_activation_bytes(sz, mb_s, seq) + logits_bytes(mb_s, 2),
                    f"{mb_s} rows/device x {seq} tokens, forward only")]
    if mc.lora:
        rows += [PlanRow("gradients", "update", 2 * w.adapters * 4, "f32 accumulator + one micro-batch's, adapters"),
                 PlanRow("update temporaries", "update", w.adapters * 4,
                         "AdamW update tree of the adapters (adapters, moments donated)")]
    else:
        # GRPOLearner donates params and optimizer state: they are updated in place, and what the
        # step adds is the optimizer's update tree (one params-shaped temporary).
        rows += [PlanRow("gradients", "update", 2 * w.train * 4, "f32 accumulator + one micro-batch's"),
                 PlanRow("update temporaries", "update", w.train * sz.pbytes,
                         "AdamW update tree (params, moments donated)")]
    if mc.remat:
        # Per-layer checkpointing keeps only each layer's input; one layer is recomputed at a time
        # and its backward roughly doubles that layer's working set.
        act = mc.num_layers * mb_t * seq * mc.hidden_size * abytes + 2 * layer_activation_bytes(sz, mb_t, seq)
        how = "remat: L layer inputs + 1 layer recomputed"
    else:
        act = (mc.num_layers + 1) * layer_activation_bytes(sz, mb_t, seq)
        how = "no remat: every layer's activations saved"
    rows.append(PlanRow("train activations", "update", act, f"{mb_t} rows/device x {seq} tokens, {how}"))
    # Logits and softmax saved for the backward, their cotangent and one temporary.
    rows.append(PlanRow("loss logits", "update", logits_bytes(mb_t, 4),
                        f"[{mb_t}, {positions}, V/{mesh[2]}] f32 x 4"
                        + (f" (chunks of {positions} of {seq} positions)" if positions < seq else "")))
    return rows


def refresh_row(sz: Sizing, w: WeightElements) -> PlanRow:
    """After the update: the Sampler's new copy of the weights, built while the old one is held."""
    if sz.mc.lora:
        held = piece_refresh_bytes(sz.mc, w.shapes, sz.mesh, sz.pbytes, sz.abytes)
        return PlanRow("sampler refresh", "refresh", held, "layer by layer in place (Sampler layer_by_layer): "
                       "one piece's new arrays and its f32 merge or gathered matrix")
    return PlanRow("sampler refresh", "refresh", (w.relaid + w.sampler) * sz.abytes,
                   f"new per-layer copy while the old is held + {w.n_relaid} tensors re-laid out for it")


def piece_refresh_bytes(mc, shapes: dict, mesh: tuple[int, int, int], pbytes: int, abytes: int) -> int:
    """What a layer_by_layer Sampler holds beyond its weights while it rebuilds them, per device:
    its largest piece's program (the old arrays are let go only once the new ones exist). A
    layer: its new arrays (compute dtype) and the float32 W + scale A B of its two largest
    adapted kernels in flight. The head or the untied table: the matrix gathered into the
    TP-only layout (parameter dtype) and its new copy (with the final norm). Checked against
    XLA's buffer assignment for the compiled pieces in tests/test_planner.py (1.0-1.2x)."""
    from memsearcher_jax.models import ShardingConfig
    from memsearcher_jax.models.config import LORA_KERNELS

    el = _layout_elems(shapes, mesh, ShardingConfig.sampling())
    L = mc.num_layers
    layer = sum(n for name, n in el.items() if name.startswith("layers.")) // L
    kernels = sorted((el[f"layers.{LORA_KERNELS[t][0]}"] // L for t in mc.lora_targets), reverse=True)
    pieces = [layer * abytes + 2 * 4 * sum(kernels[:2])]
    for table in ("embed", "lm_head"):
        if table in el:
            pieces.append(el[table] * pbytes + (el[table] + el["final_norm"]) * abytes)
    return max(pieces)

