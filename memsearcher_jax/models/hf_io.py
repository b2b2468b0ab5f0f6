"""Hugging Face import and export for Qwen2 and Qwen3 (dense), driven by ONE key table.

`from_pretrained(path)` streams tensors straight from memory-mapped safetensors onto their
`NamedSharding`s: each device's shard is read by `jax.make_array_from_callback`, so a 14B
model never needs a full host copy (at most one layer tensor at a time is materialised).
`save_pretrained(model, path)` writes the same table back out, so a round trip is exact.
A LoRA model (config.lora_rank > 0) is written with its adapters merged into the kernels
(full weights transformers loads as they are); `save_adapters(model, path)` writes the
adapters alone in PEFT's format (adapter_model.safetensors + adapter_config.json).

Everything that can be wrong with a checkpoint (unsupported model_type, missing or unexpected
keys, wrong shapes, corrupt or truncated files) is checked from the headers first, and the
error names the key or file, before any array is created or anything compiled.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

from memsearcher_jax.errors import UserInputError
from memsearcher_jax.models.config import LORA_KERNELS, ModelConfig
from memsearcher_jax.models.qwen2 import Qwen2, init_lora, is_lora_name, lora_delta
from memsearcher_jax.models.safetensors_io import SafetensorsError, TensorDirectory, save_file
from memsearcher_jax.models.sharding import ShardingConfig, fit_spec, param_spec

# reading_vocab.json: the name and value pools of a reading tokenizer (memsearcher_jax.data.vocab).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "reading_vocab.json")


class CheckpointError(UserInputError):
    """A Hugging Face checkpoint does not match what the model expects."""


@dataclasses.dataclass(frozen=True)
class KeyRule:
    """One row of the key table.

    hf: HF key, with `{i}` for the layer index when `stacked`.
    ours: our parameter name (state path joined by ".").
    to_ours / to_hf: per-tensor layout changes (for stacked params, one layer's slice).
    """

    hf: str
    ours: str
    to_ours: Callable[[np.ndarray, ModelConfig], np.ndarray]
    to_hf: Callable[[np.ndarray, ModelConfig], np.ndarray]
    stacked: bool = True
    tied_only: bool | None = None  # None: always; False: only when untied
    when: str | None = None  # a ModelConfig flag the row needs ("attention_bias", "qk_norm"); None: always


def _same(w, c):
    return w


def _t(w, c):
    return w.T


def _heads_in(n_attr):  # [N*Dh, D] -> [D, N, Dh]
    return lambda w, c: w.T.reshape(c.hidden_size, getattr(c, n_attr), c.head_dim)


def _heads_in_inv(w, c):  # [D, N, Dh] -> [N*Dh, D]
    return w.reshape(w.shape[0], -1).T


def _bias_in(n_attr):  # [N*Dh] -> [N, Dh]
    return lambda w, c: w.reshape(getattr(c, n_attr), c.head_dim)


def _bias_inv(w, c):
    return w.reshape(-1)


def _o_in(w, c):  # [D, H*Dh] -> [H, Dh, D]
    return w.T.reshape(c.num_heads, c.head_dim, c.hidden_size)


def _o_inv(w, c):  # [H, Dh, D] -> [D, H*Dh]
    return w.reshape(-1, w.shape[-1]).T


_L = "model.layers.{i}."
KEY_TABLE: tuple[KeyRule, ...] = (
    KeyRule("model.embed_tokens.weight", "embed", _same, _same, stacked=False),
    KeyRule("model.norm.weight", "final_norm", _same, _same, stacked=False),
    KeyRule("lm_head.weight", "lm_head", _t, _t, stacked=False, tied_only=False),
    KeyRule(_L + "input_layernorm.weight", "layers.attn_norm", _same, _same),
    KeyRule(_L + "post_attention_layernorm.weight", "layers.mlp_norm", _same, _same),
    KeyRule(_L + "self_attn.q_proj.weight", "layers.q_kernel", _heads_in("num_heads"), _heads_in_inv),
    KeyRule(_L + "self_attn.q_proj.bias", "layers.q_bias", _bias_in("num_heads"), _bias_inv, when="attention_bias"),
    KeyRule(_L + "self_attn.k_proj.weight", "layers.k_kernel", _heads_in("num_kv_heads"), _heads_in_inv),
    KeyRule(_L + "self_attn.k_proj.bias", "layers.k_bias", _bias_in("num_kv_heads"), _bias_inv,
            when="attention_bias"),
    KeyRule(_L + "self_attn.v_proj.weight", "layers.v_kernel", _heads_in("num_kv_heads"), _heads_in_inv),
    KeyRule(_L + "self_attn.v_proj.bias", "layers.v_bias", _bias_in("num_kv_heads"), _bias_inv,
            when="attention_bias"),
    KeyRule(_L + "self_attn.q_norm.weight", "layers.q_norm", _same, _same, when="qk_norm"),
    KeyRule(_L + "self_attn.k_norm.weight", "layers.k_norm", _same, _same, when="qk_norm"),
    KeyRule(_L + "self_attn.o_proj.weight", "layers.o_kernel", _o_in, _o_inv),
    KeyRule(_L + "mlp.gate_proj.weight", "layers.gate_kernel", _t, _t),
    KeyRule(_L + "mlp.up_proj.weight", "layers.up_kernel", _t, _t),
    KeyRule(_L + "mlp.down_proj.weight", "layers.down_kernel", _t, _t),
)


def active_rules(cfg: ModelConfig) -> list[KeyRule]:
    return [r for r in KEY_TABLE if (r.tied_only is None or r.tied_only == cfg.tie_word_embeddings)
            and (r.when is None or getattr(cfg, r.when))]


def hf_shape(rule: KeyRule, cfg: ModelConfig) -> tuple[int, ...]:
    """The HF tensor shape a rule expects (for one layer if stacked)."""
    D, F, H, K, Dh, V = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                         cfg.head_dim, cfg.vocab_size)
    return {
        "embed": (V, D), "final_norm": (D,), "lm_head": (V, D), "layers.attn_norm": (D,),
        "layers.mlp_norm": (D,), "layers.q_kernel": (H * Dh, D), "layers.q_bias": (H * Dh,),
        "layers.k_kernel": (K * Dh, D), "layers.k_bias": (K * Dh,), "layers.v_kernel": (K * Dh, D),
        "layers.v_bias": (K * Dh,), "layers.o_kernel": (D, H * Dh), "layers.gate_kernel": (F, D),
        "layers.up_kernel": (F, D), "layers.down_kernel": (D, F), "layers.q_norm": (Dh,), "layers.k_norm": (Dh,),
    }[rule.ours]


def expected_hf_keys(cfg: ModelConfig) -> dict[str, tuple[KeyRule, int | None]]:
    out = {}
    for rule in active_rules(cfg):
        if rule.stacked:
            for i in range(cfg.num_layers):
                out[rule.hf.format(i=i)] = (rule, i)
        else:
            out[rule.hf] = (rule, None)
    return out


def check_checkpoint(tensors: TensorDirectory, cfg: ModelConfig) -> None:
    """Validate key set and shapes from the headers alone; raise CheckpointError naming the problem."""
    expected = expected_hf_keys(cfg)
    present = set(tensors.keys())
    # Tied checkpoints sometimes also store lm_head.weight (equal to the embedding); accept it.
    ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    ignorable |= {k for k in present if k.endswith("rotary_emb.inv_freq")}
    missing = sorted(set(expected) - present)
    unexpected = sorted(present - set(expected) - ignorable)
    if missing:
        raise CheckpointError(f"{tensors.model_dir}: missing keys {missing[:10]}"
                              + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else ""))
    if unexpected:
        raise CheckpointError(f"{tensors.model_dir}: unexpected keys {unexpected[:10]}"
                              + (f" (+{len(unexpected) - 10} more)" if len(unexpected) > 10 else ""))
    for key, (rule, _) in expected.items():
        want = hf_shape(rule, cfg)
        got = tensors.shape(key)
        if tuple(got) != want:
            raise CheckpointError(f"{tensors.file_of(key)}: key {key!r} has shape {tuple(got)}, expected {want}")


def our_shape(rule: KeyRule, cfg: ModelConfig) -> tuple[int, ...]:
    one = tuple(rule.to_ours(np.empty(hf_shape(rule, cfg), np.float32), cfg).shape)
    return (cfg.num_layers,) + one if rule.stacked else one


def param_sharding(name: str, shape, mesh: Mesh | None, sharding: ShardingConfig):
    if mesh is None:
        return SingleDeviceSharding(jax.devices()[0])
    return NamedSharding(mesh, fit_spec(shape, param_spec(name, len(shape), sharding), mesh))


def eos_token_ids(model_dir: str | os.PathLike) -> list[int]:
    """Every end-of-sequence id a model directory declares: `eos_token_id` (an int or a list) of
    its generation_config.json and config.json, in that order, without repeats. Qwen2.5-Instruct
    lists [151645, 151643] (<|im_end|>, <|endoftext|>); transformers' generate stops on each."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = os.path.join(os.fspath(model_dir), name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            try:
                value = json.load(f).get("eos_token_id")
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{path} is not valid JSON: {e}") from e
        for i in value if isinstance(value, list) else [value]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return ids


def from_pretrained(path: str | os.PathLike, *, dtype: str = "float32", param_dtype: str | None = None,
                    mesh: Mesh | None = None, sharding: ShardingConfig | None = None, lora_seed: int = 0,
                    **config_overrides) -> Qwen2:
    """Load a local Hugging Face Qwen2 / Qwen3 directory into a (sharded) Qwen2 module (which
    serves both families; config.json's model_type picks).

    dtype: compute dtype; param_dtype: storage dtype (defaults to `dtype`).
    mesh/sharding: place each parameter on `NamedSharding(mesh, spec)`; without a mesh the
    model lives on the first device. Extra keyword arguments override ModelConfig fields
    (e.g. scan_layers=True, or lora_rank=16 for fresh LoRA adapters, drawn from `lora_seed`,
    over the loaded weights).
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model directory not found: {path}")
    cfg = ModelConfig.from_hf_config(path, dtype=dtype, param_dtype=param_dtype or dtype, **config_overrides)
    try:
        tensors = TensorDirectory(path)
    except SafetensorsError as e:
        raise CheckpointError(str(e)) from e
    check_checkpoint(tensors, cfg)
    sharding = sharding or ShardingConfig.training()
    np_dtype = np.dtype(jnp.dtype(cfg.param_dtype))
    rules = {r.ours: r for r in active_rules(cfg)}

    def load(rule: KeyRule) -> jax.Array:
        shape = our_shape(rule, cfg)
        last: dict = {}

        def layer_tensor(i):
            key = rule.hf.format(i=i) if rule.stacked else rule.hf
            if key not in last:  # consecutive devices usually ask for the same layer
                last.clear()
                last[key] = np.asarray(rule.to_ours(tensors.get(key), cfg)).astype(np_dtype)
            return last[key]

        def callback(index):
            if not rule.stacked:
                return layer_tensor(None)[index]
            layers = range(cfg.num_layers)[index[0]]
            return np.stack([layer_tensor(i)[index[1:]] for i in layers])

        return jax.make_array_from_callback(shape, param_sharding(rule.ours, shape, mesh, sharding), callback)

    abstract = nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0), mesh=mesh, sharding=sharding))
    graphdef, state = nnx.split(abstract)
    flat = nnx.to_flat_state(state)
    adapters = init_lora(cfg, jax.random.key(lora_seed)) if cfg.lora else {}
    for path_key, var in flat:
        name = ".".join(str(p) for p in path_key)
        if is_lora_name(name):  # fresh adapters: not in a Hugging Face checkpoint
            value = adapters[name.split(".")[-1]]
            var.set_value(jax.device_put(value, param_sharding(name, value.shape, mesh, sharding)))
            continue
        if name not in rules:
            raise CheckpointError(f"no key-table rule for parameter {name!r}")
        var.set_value(load(rules[name]))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def param_dict(model: Qwen2) -> dict[str, jax.Array]:
    """{"layers.q_kernel": array, ...} for every parameter of the model."""
    return {".".join(str(p) for p in k): v.get_value() for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def shard_model(model: Qwen2, mesh: Mesh, sharding: ShardingConfig, move_dtype=None) -> Qwen2:
    """Place every parameter on its NamedSharding and return a model that constrains activations.

    move_dtype: cast each parameter that has to move (its placement changes) to this dtype
    first, so the moved copy is made in it; parameters already in place stay as they are.
    The trainer re-lays its f32 masters out for the sampler this way, in the compute dtype
    the sampler keeps anyway."""
    graphdef, state = nnx.split(model)
    flat = nnx.to_flat_state(state)
    for k, var in flat:
        name = ".".join(str(p) for p in k)
        value = var.get_value()
        target = param_sharding(name, value.shape, mesh, sharding)
        if move_dtype is not None and not (isinstance(value, jax.Array)
                                           and value.sharding.is_equivalent_to(target, value.ndim)):
            value = value.astype(move_dtype)
        var.set_value(jax.device_put(value, target))
    new = nnx.merge(graphdef, nnx.from_flat_state(flat))
    new.mesh = mesh
    new.sharding = sharding
    return new


def _layer_tensor(params: dict, name: str, i: int, cfg: ModelConfig) -> np.ndarray:
    """Layer i of stacked parameter `name`; a LoRA target's kernel comes back merged, W + scale A B,
    in float32 (the writer casts it to the checkpoint dtype once)."""
    kernel = name.split(".")[-1]
    target = next((t for t, (k, _) in LORA_KERNELS.items() if k == kernel), None)
    if target is None or f"layers.{target}_lora_a" not in params:
        return np.asarray(jax.device_get(params[name][i]))
    delta = lora_delta(params[f"layers.{target}_lora_a"][i], params[f"layers.{target}_lora_b"][i], cfg.lora_scale,
                       LORA_KERNELS[target][1])
    return np.asarray(jax.device_get(params[name][i].astype(jnp.float32) + delta))


def hf_state_dict(model: Qwen2):
    """Yield (hf_key, numpy array) pairs, one tensor at a time, in the checkpoint dtype. LoRA
    adapters are merged into their kernels (one layer at a time)."""
    cfg = model.config
    params = param_dict(model)
    for rule in active_rules(cfg):
        arr = params[rule.ours]
        if rule.stacked:
            for i in range(cfg.num_layers):
                yield rule.hf.format(i=i), np.asarray(rule.to_hf(_layer_tensor(params, rule.ours, i, cfg), cfg))
        else:
            yield rule.hf, np.asarray(rule.to_hf(np.asarray(jax.device_get(arr)), cfg))


# PEFT's module names for our LoRA targets, and its file names.
PEFT_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
PEFT_WEIGHTS, PEFT_CONFIG = "adapter_model.safetensors", "adapter_config.json"


def peft_state_dict(model: Qwen2):
    """Yield (PEFT key, numpy array) for every adapter: lora_A.weight [r, in] and lora_B.weight
    [out, r] per layer and target (torch's [out, in] convention; in/out flattened as the
    Hugging Face kernels are), keyed base_model.model.model.layers.{i}.<module>.lora_{A,B}.weight."""
    cfg = model.config
    if not cfg.lora:
        raise ValueError("the model has no LoRA adapters (model.lora_rank is 0)")
    params = param_dict(model)
    r = cfg.lora_rank
    for i in range(cfg.num_layers):
        for t in cfg.lora_targets:
            a = np.asarray(jax.device_get(params[f"layers.{t}_lora_a"][i]))  # [in..., r]
            b = np.asarray(jax.device_get(params[f"layers.{t}_lora_b"][i]))  # [r, out...]
            key = f"base_model.model.model.layers.{i}.{PEFT_MODULES[t]}"
            yield f"{key}.lora_A.weight", a.reshape(-1, r).T
            yield f"{key}.lora_B.weight", b.reshape(r, -1).T


def peft_config(cfg: ModelConfig, base_model_name_or_path: str | None = None) -> dict:
    """adapter_config.json for our adapters (peft.LoraConfig's fields)."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg.lora_rank, "lora_alpha": cfg.lora_alpha,
        "target_modules": sorted(PEFT_MODULES[t].split(".")[-1] for t in cfg.lora_targets),
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
        "inference_mode": True, "init_lora_weights": True, "modules_to_save": None, "layers_to_transform": None,
        "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
        "base_model_name_or_path": base_model_name_or_path,
    }


def save_adapters(model: Qwen2, path: str | os.PathLike, *, base_model_name_or_path: str | None = None,
                  dtype: str | None = None) -> str:
    """Write the LoRA adapters alone in PEFT's format: adapter_model.safetensors and
    adapter_config.json (`peft.PeftModel.from_pretrained(base, path)` loads them)."""
    path = os.fspath(path)
    np_dtype = np.dtype(jnp.dtype(dtype or "float32"))
    tensors = {k: np.ascontiguousarray(v.astype(np_dtype)) for k, v in peft_state_dict(model)}
    with _staging_dir(path) as tmp:
        save_file(tensors, os.path.join(tmp, PEFT_WEIGHTS), metadata={"format": "pt"})
        with open(os.path.join(tmp, PEFT_CONFIG), "w", encoding="utf-8") as f:
            json.dump(peft_config(model.config, base_model_name_or_path), f, indent=2)
        _install(tmp, path)
    return path


def save_pretrained(model: Qwen2, path: str | os.PathLike, *, tokenizer_dir: str | None = None,
                    max_shard_bytes: int = 5 * 1024 ** 3, dtype: str | None = None) -> str:
    """Write a Hugging Face model directory: config.json, generation_config.json,
    model.safetensors (or shards + model.safetensors.index.json), and tokenizer files.

    dtype: tensor dtype to store (defaults to the model's param_dtype).
    The files are written in a temporary directory beside `path`, then moved in: model files an
    earlier export left in `path` are replaced, anything else there is kept.
    """
    path = os.fspath(path)
    out_dtype = dtype or model.config.param_dtype
    with _staging_dir(path) as tmp:
        _write_model_files(model, tmp, tokenizer_dir, max_shard_bytes, out_dtype)
        _install(tmp, path)
    return path


def _write_model_files(model: Qwen2, tmp: str, tokenizer_dir: str | None, max_shard_bytes: int,
                       out_dtype: str) -> None:
    """save_pretrained's files, written into the staging directory `tmp`."""
    cfg = model.config
    np_dtype = np.dtype(jnp.dtype(out_dtype))
    shards: list[dict[str, np.ndarray]] = [{}]
    sizes = [0]
    total = 0
    weight_map: dict[str, int] = {}
    shard_files: list[str] = []

    def flush_index():  # write the full shard and release its host memory
        idx = len(shard_files)
        name = f"model-{idx + 1:05d}.safetensors"
        save_file(shards[-1], os.path.join(tmp, name), metadata={"format": "pt"})
        shard_files.append(name)
        shards[-1] = {}
        sizes[-1] = 0

    for key, arr in hf_state_dict(model):
        arr = arr.astype(np_dtype)
        if sizes[-1] and sizes[-1] + arr.nbytes > max_shard_bytes:
            flush_index()
        shards[-1][key] = arr
        sizes[-1] += arr.nbytes
        total += arr.nbytes
        weight_map[key] = len(shard_files)
    if not shard_files:
        save_file(shards[-1], os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    else:
        if shards[-1]:
            flush_index()
        n = len(shard_files)
        final_names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        for old, new in zip(shard_files, final_names):
            os.replace(os.path.join(tmp, old), os.path.join(tmp, new))
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: final_names[v] for k, v in sorted(weight_map.items())}}
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg.to_hf_config(torch_dtype=out_dtype), f, indent=2)
    with open(os.path.join(tmp, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
                   "pad_token_id": cfg.bos_token_id, "do_sample": True, "temperature": 1.0,
                   "top_p": 1.0}, f, indent=2)
    if tokenizer_dir is not None:
        copied = 0
        for name in TOKENIZER_FILES:
            src = os.path.join(tokenizer_dir, name)
            if os.path.exists(src):
                shutil.copy2(src, os.path.join(tmp, name))
                copied += 1
        if not copied:
            raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {tokenizer_dir}")


def is_model_file(name: str) -> bool:
    """A file save_pretrained or save_adapters writes (the only files an export replaces)."""
    return (name in ("config.json", "generation_config.json", "model.safetensors.index.json", PEFT_WEIGHTS,
                     PEFT_CONFIG) or name in TOKENIZER_FILES
            or (name.startswith("model") and name.endswith(".safetensors")))


@contextlib.contextmanager
def _staging_dir(path: str):
    """A temporary directory beside `path` (same file system, so files move by rename),
    removed on the way out whatever happens; a `path` that is a file is refused first."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserInputError(f"{path} is a file, not a directory: choose another output directory")
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-export-", dir=parent)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _install(tmp: str, path: str) -> None:
    """Move the files written in `tmp` into `path`: the model files an earlier export left there
    are replaced (a stale shard would otherwise be read with the new index); nothing else in
    `path` (a README, the user's notes) is touched."""
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):
        if is_model_file(name) and os.path.isfile(os.path.join(path, name)):
            os.remove(os.path.join(path, name))
    for name in os.listdir(tmp):
        os.replace(os.path.join(tmp, name), os.path.join(path, name))

