"""Sharding layouts as data: PartitionSpecs for every parameter and the main activations.

Mesh axes are always ("data", "fsdp", "tp"). The training layout shards weights over
`fsdp` (ZeRO-3 style) and `tp` (Megatron-style tensor parallel); the sampling layout keeps
only `tp` on the weights (no all-gather per decoded token) and uses both `data` and `fsdp`
for the batch. The same module code serves both: the model asks this table, never the mesh.

A dimension that the mesh axis does not divide is replicated along that axis instead
(`fit_spec`), so odd head counts (Qwen2.5-0.5B has 14 heads, 2 KV heads) still run.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from memsearcher_jax.models.config import LORA_KERNELS

MESH_AXES = ("data", "fsdp", "tp")
BATCH = ("data", "fsdp")  # the batch dimension is split over both data-parallel axes


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
    # Parameters (stacked layer params carry a leading [L] dimension, never sharded).
    embed: P          # [V, D]
    lm_head: P        # [D, V]
    norm: P           # [D]; layer norms are [L, D]; Qwen3's q/k head norms [L, Dh] (replicated)
    q_kernel: P       # [L, D, H, Dh]
    q_bias: P         # [L, H, Dh]
    kv_kernel: P      # [L, D, K, Dh]
    kv_bias: P        # [L, K, Dh]
    o_kernel: P       # [L, H, Dh, D]
    up_kernel: P      # [L, D, F]  (gate and up)
    down_kernel: P    # [L, F, D]
    # Activations.
    act_btd: P        # [B, T, D]
    act_btf: P        # [B, T, F]
    act_bthd: P       # [B, T, H, Dh] (queries, keys and values use the same spec)
    logits_btv: P     # [B, T, V]
    cache: P          # [L, B, S, K, Dh] KV cache
    batch: P          # [B, T] token ids, masks, positions

    @classmethod
    def training(cls) -> ShardingConfig:
        """FSDP + TP: weights split over both axes, batch over data and fsdp."""
        return cls(
            embed=P("tp", "fsdp"),
            lm_head=P("fsdp", "tp"),
            norm=P(None),
            q_kernel=P(None, "fsdp", "tp", None),
            q_bias=P(None, "tp", None),
            kv_kernel=P(None, "fsdp", "tp", None),
            kv_bias=P(None, "tp", None),
            o_kernel=P(None, "tp", None, "fsdp"),
            up_kernel=P(None, "fsdp", "tp"),
            down_kernel=P(None, "tp", "fsdp"),
            act_btd=P(BATCH, None, None),
            act_btf=P(BATCH, None, "tp"),
            act_bthd=P(BATCH, None, "tp", None),
            logits_btv=P(BATCH, None, "tp"),
            cache=P(None, BATCH, None, "tp", None),
            batch=P(BATCH, None),
        )

    @classmethod
    def sampling(cls) -> ShardingConfig:
        """TP only on the weights (replicated over data/fsdp); batch over data and fsdp."""
        t = cls.training()
        return dataclasses.replace(
            t,
            embed=P("tp", None),
            lm_head=P(None, "tp"),
            q_kernel=P(None, None, "tp", None),
            kv_kernel=P(None, None, "tp", None),
            o_kernel=P(None, "tp", None, None),
            up_kernel=P(None, None, "tp"),
            down_kernel=P(None, "tp", None),
        )


# Which ShardingConfig field lays out each parameter of the Qwen2 module (state path names);
# q_norm / k_norm (Qwen3) are [L, Dh] vectors like the other norms: replicated.
PARAM_SPEC_FIELD = {
    "embed": "embed",
    "lm_head": "lm_head",
    "final_norm": "norm",
    "layers.attn_norm": "norm",
    "layers.mlp_norm": "norm",
    "layers.q_norm": "norm",
    "layers.k_norm": "norm",
    "layers.q_kernel": "q_kernel",
    "layers.q_bias": "q_bias",
    "layers.k_kernel": "kv_kernel",
    "layers.k_bias": "kv_bias",
    "layers.v_kernel": "kv_kernel",
    "layers.v_bias": "kv_bias",
    "layers.o_kernel": "o_kernel",
    "layers.gate_kernel": "up_kernel",
    "layers.up_kernel": "up_kernel",
    "layers.down_kernel": "down_kernel",
}


def param_spec(name: str, ndim: int, sharding: ShardingConfig) -> P:
    """The PartitionSpec of parameter `name` (e.g. "layers.q_kernel"), padded to `ndim`.

    A LoRA adapter follows its kernel: A [L, in..., r] keeps the kernel's input-dim axes,
    B [L, r, out...] its output-dim axes; the rank dimension is never split."""
    target, _, ab = name.removeprefix("layers.").partition("_lora_")
    if name.startswith("layers.") and ab in ("a", "b") and target in LORA_KERNELS:
        kernel, n_in = LORA_KERNELS[target]
        ks = tuple(param_spec(f"layers.{kernel}", 4 if target in ("q", "k", "v", "o") else 3, sharding))
        spec = ks[:1 + n_in] + (None,) if ab == "a" else (ks[0], None) + ks[1 + n_in:]
        return P(*(spec + (None,) * (ndim - len(spec)))[:ndim])
    if name not in PARAM_SPEC_FIELD:
        raise KeyError(f"no sharding rule for parameter {name!r}; known: {sorted(PARAM_SPEC_FIELD)}")
    spec = tuple(getattr(sharding, PARAM_SPEC_FIELD[name]))
    if name.startswith("layers.") and PARAM_SPEC_FIELD[name] == "norm":
        spec = (None,) + spec  # [L, D]
    spec = spec + (None,) * (ndim - len(spec))
    return P(*spec[:ndim])


def _axis_size(mesh: Mesh, axes) -> int:
    if axes is None:
        return 1
    names = axes if isinstance(axes, tuple) else (axes,)
    return math.prod(mesh.shape[n] for n in names)


def fit_spec(shape: Sequence[int], spec: P, mesh: Mesh) -> P:
    """Drop mesh axes from dimensions they do not divide (those dims are replicated instead)."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        if axes is None:
            out.append(None)
            continue
        names = axes if isinstance(axes, tuple) else (axes,)
        # Keep the longest prefix of axes whose product divides the dimension.
        kept = []
        for n in names:
            if dim % (_axis_size(mesh, tuple(kept + [n]))) == 0:
                kept.append(n)
            else:
                break
        out.append(tuple(kept) if len(kept) > 1 else (kept[0] if kept else None))
    return P(*out)


def named_sharding(mesh: Mesh, shape: Sequence[int], spec: P) -> NamedSharding:
    return NamedSharding(mesh, fit_spec(shape, spec, mesh))


def make_mesh(data: int = 1, fsdp: int = 1, tp: int = 1, devices=None) -> Mesh:
    """A ("data", "fsdp", "tp") mesh with classic GSPMD (Auto) axis types.

    `jax.make_mesh` defaults to Explicit axis types in recent JAX; the model relies on
    automatic propagation with sharding constraints, so Auto is passed explicitly.
    """
    devices = list(devices if devices is not None else jax.devices())
    need = data * fsdp * tp
    if need != len(devices):
        raise ValueError(
            f"mesh data={data} x fsdp={fsdp} x tp={tp} = {need} devices, but {len(devices)} are available")
    auto = (jax.sharding.AxisType.Auto,) * 3
    return jax.make_mesh((data, fsdp, tp), MESH_AXES, axis_types=auto, devices=devices)


def constrain(x: jax.Array, spec: P, mesh: Mesh | None) -> jax.Array:
    """with_sharding_constraint when a mesh is set; a no-op on one device."""
    if mesh is None or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, named_sharding(mesh, x.shape, spec))
