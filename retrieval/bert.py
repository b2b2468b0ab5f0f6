"""A BERT encoder in Flax NNX that loads Hugging Face `BertModel` safetensors.

Only the encoder trunk is built (embeddings + transformer layers); the pooler
is unused by e5 / sentence-transformers mean pooling. Inference only: no
dropout. Weights are loaded through one table (HF key -> our path, transpose).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
from flax import nnx


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str = "gelu"

    @classmethod
    def from_hf(cls, model_dir: str) -> BertConfig:
        path = os.path.join(model_dir, "config.json")
        with open(path, encoding="utf-8") as f:
            c = json.load(f)
        if c.get("model_type", "bert") != "bert":
            raise ValueError(f"{path}: model_type {c.get('model_type')!r} is not supported; expected 'bert'")
        if c.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: position_embedding_type {c['position_embedding_type']!r}; expected 'absolute'")
        return cls(
            vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], num_layers=c["num_hidden_layers"],
            num_heads=c["num_attention_heads"], intermediate_size=c["intermediate_size"],
            max_position=c["max_position_embeddings"], type_vocab_size=c.get("type_vocab_size", 2),
            layer_norm_eps=c.get("layer_norm_eps", 1e-12), hidden_act=c.get("hidden_act", "gelu"),
        )


def _act(name: str):
    # HF "gelu" is the exact erf form; "gelu_new"/"gelu_pytorch_tanh" are the tanh approximation.
    table = {"gelu": lambda x: jax.nn.gelu(x, approximate=False),
             "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
             "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
             "relu": jax.nn.relu}
    if name not in table:
        raise ValueError(f"hidden_act {name!r} not supported; expected one of {sorted(table)}")
    return table[name]


class BertLayer(nnx.Module):
    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.num_heads = cfg.num_heads
        self.query = nnx.Linear(h, h, dtype=dtype, rngs=rngs)
        self.key = nnx.Linear(h, h, dtype=dtype, rngs=rngs)
        self.value = nnx.Linear(h, h, dtype=dtype, rngs=rngs)
        self.attn_out = nnx.Linear(h, h, dtype=dtype, rngs=rngs)
        self.attn_norm = nnx.LayerNorm(h, epsilon=eps, dtype=dtype, rngs=rngs)
        self.ffn_in = nnx.Linear(h, cfg.intermediate_size, dtype=dtype, rngs=rngs)
        self.ffn_out = nnx.Linear(cfg.intermediate_size, h, dtype=dtype, rngs=rngs)
        self.ffn_norm = nnx.LayerNorm(h, epsilon=eps, dtype=dtype, rngs=rngs)
        self.act = _act(cfg.hidden_act)

    def __call__(self, x: jax.Array, bias: jax.Array) -> jax.Array:
        """x: [B, T, H]; bias: [B, 1, 1, T] additive attention mask -> [B, T, H]."""
        b, t, h = x.shape
        d = h // self.num_heads
        split = lambda y: y.reshape(b, t, self.num_heads, d)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        # jax.nn.dot_product_attention's XLA path: logits and softmax in float32 whatever the
        # compute dtype (parity with PyTorch), scale 1/sqrt(d). On XLA CPU it ran 1.2x faster
        # than the equivalent "bqnd,bknd->bnqk" einsums (a [64, 144] MiniLM batch, same outputs
        # to 2e-7), from the head-batched layout it gives the dots.
        ctx = jax.nn.dot_product_attention(q, k, v, bias=bias, implementation="xla").reshape(b, t, h)
        x = self.attn_norm(x + self.attn_out(ctx))
        return self.ffn_norm(x + self.ffn_out(self.act(self.ffn_in(x))))


class BertEncoder(nnx.Module):
    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        h = cfg.hidden_size
        self.cfg = cfg
        self.word = nnx.Embed(cfg.vocab_size, h, dtype=dtype, rngs=rngs)
        self.position = nnx.Embed(cfg.max_position, h, dtype=dtype, rngs=rngs)
        self.token_type = nnx.Embed(cfg.type_vocab_size, h, dtype=dtype, rngs=rngs)
        self.emb_norm = nnx.LayerNorm(h, epsilon=cfg.layer_norm_eps, dtype=dtype, rngs=rngs)
        self.layers = nnx.List([BertLayer(cfg, rngs=rngs, dtype=dtype) for _ in range(cfg.num_layers)])

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """input_ids, attention_mask: [B, T] int -> last hidden states [B, T, H] (float32)."""
        t = input_ids.shape[1]
        pos = jnp.arange(t)[None, :]
        x = self.word(input_ids) + self.position(pos) + self.token_type(jnp.zeros_like(input_ids))
        x = self.emb_norm(x)
        neg = jnp.finfo(jnp.float32).min
        bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, neg).astype(jnp.float32)
        for layer in self.layers:
            x = layer(x, bias)
        return x.astype(jnp.float32)


# HF BertModel key (after stripping a leading "bert.") -> (our attribute path, transpose?).
_LAYER_TABLE = [
    (r"attention\.self\.query\.(weight|bias)", "query"),
    (r"attention\.self\.key\.(weight|bias)", "key"),
    (r"attention\.self\.value\.(weight|bias)", "value"),
    (r"attention\.output\.dense\.(weight|bias)", "attn_out"),
    (r"attention\.output\.LayerNorm\.(weight|bias)", "attn_norm"),
    (r"intermediate\.dense\.(weight|bias)", "ffn_in"),
    (r"output\.dense\.(weight|bias)", "ffn_out"),
    (r"output\.LayerNorm\.(weight|bias)", "ffn_norm"),
]
_EMB_TABLE = {
    "embeddings.word_embeddings.weight": ("word", "embedding"),
    "embeddings.position_embeddings.weight": ("position", "embedding"),
    "embeddings.token_type_embeddings.weight": ("token_type", "embedding"),
    "embeddings.LayerNorm.weight": ("emb_norm", "scale"),
    "embeddings.LayerNorm.bias": ("emb_norm", "bias"),
}


def _target(model: BertEncoder, key: str):
    """Map one HF key to (module, param name, transpose) or None if unused (pooler, position_ids)."""
    if key in _EMB_TABLE:
        mod, name = _EMB_TABLE[key]
        return getattr(model, mod), name, False
    m = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)", key)
    if not m:
        return None
    layer = model.layers[int(m.group(1))]
    for pattern, attr in _LAYER_TABLE:
        mm = re.fullmatch(pattern, m.group(2))
        if mm:
            mod = getattr(layer, attr)
            is_norm = isinstance(mod, nnx.LayerNorm)
            if mm.group(1) == "weight":
                return mod, ("scale" if is_norm else "kernel"), not is_norm  # torch Linear is [out, in]
            return mod, "bias", False
    raise KeyError(f"unrecognised BERT weight {key!r}")


def load_bert(model_dir: str, dtype=jnp.float32) -> BertEncoder:
    """Build a BertEncoder from `model_dir` (config.json + model.safetensors), checking every weight."""
    from safetensors.numpy import load_file

    cfg = BertConfig.from_hf(model_dir)
    model = BertEncoder(cfg, rngs=nnx.Rngs(0), dtype=dtype)
    path = os.path.join(model_dir, "model.safetensors")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir!r} has no model.safetensors; expected a Hugging Face BERT checkpoint")
    tensors = load_file(path)
    loaded = set()
    for raw_key, value in tensors.items():
        key = raw_key[len("bert."):] if raw_key.startswith("bert.") else raw_key
        if key.startswith(("pooler.", "cls.")) or key.endswith("position_ids"):
            continue
        target = _target(model, key)
        if target is None:
            continue
        mod, name, transpose = target
        param = getattr(mod, name)
        arr = value.T if transpose else value
        current = param.get_value()
        if tuple(current.shape) != arr.shape:
            raise ValueError(f"weight {raw_key}: shape {arr.shape} does not match model {tuple(current.shape)}")
        param[...] = jnp.asarray(arr, dtype=current.dtype)
        loaded.add((id(mod), name))
    expected = {(id(m), n) for m, n in _all_params(model)}
    missing = expected - loaded
    if missing:
        raise ValueError(f"{path}: {len(missing)} model weights were not found in the checkpoint")
    return model


def _all_params(model: BertEncoder):
    mods = [model.word, model.position, model.token_type, model.emb_norm]
    for layer in model.layers:
        mods += [layer.query, layer.key, layer.value, layer.attn_out, layer.attn_norm,
                 layer.ffn_in, layer.ffn_out, layer.ffn_norm]
    for m in mods:
        if isinstance(m, nnx.Embed):
            yield m, "embedding"
        elif isinstance(m, nnx.LayerNorm):
            yield m, "scale"
            yield m, "bias"
        else:
            yield m, "kernel"
            yield m, "bias"
