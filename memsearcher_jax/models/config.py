"""ModelConfig: the static description of a Qwen2 / Qwen2.5 or Qwen3 (dense) decoder.

One named constructor per released Qwen2.5 Instruct and Qwen3 dense checkpoint (values from
the public Hugging Face `config.json` files), tiny presets for tests, and a round trip to and
from a Hugging Face `config.json`.

The two families differ only in the attention block: Qwen2 has biases on the q/k/v
projections; Qwen3 has none and instead RMS-normalises each query and key head (weights
[head_dim], before rope). `model_type` selects the family; `attention_bias` and `qk_norm`
follow from it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3")
DTYPES = ("float32", "bfloat16", "float16")  # accepted for param_dtype and dtype
# The projections LoRA may adapt, by their short names (PEFT's target_modules add "_proj").
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# (kernel name, number of input dims) of each LoRA target, as the module stores the kernels.
LORA_KERNELS = {"q": ("q_kernel", 1), "k": ("k_kernel", 1), "v": ("v_kernel", 1), "o": ("o_kernel", 2),
                "gate": ("gate_kernel", 1), "up": ("up_kernel", 1), "down": ("down_kernel", 1)}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32768
    bos_token_id: int = 151643
    eos_token_id: int = 151645
    # Storage dtype of the parameters and dtype of the matmuls. Norms, softmax and the
    # final log-softmax always run in float32.
    param_dtype: str = "float32"
    dtype: str = "float32"
    # lax.scan over the stacked layers: compile time stays flat as depth grows.
    scan_layers: bool = False
    # Rematerialise each layer in the backward pass (activation memory ~ one layer).
    remat: bool = False
    # Training-forward attention (`CausalLM.hidden_states`) in blocks of this many queries, each
    # against the keys up to its own last slot (the later ones are all masked): n blocks compute
    # (n + 1) / 2n of the T x T scores. 0: all queries at once. Same result either way.
    train_query_block: int = 0
    # "qwen2" (Qwen2 / Qwen2.5: q/k/v biases) or "qwen3" (Qwen3 dense: per-head q/k RMSNorm, no biases).
    model_type: str = "qwen2"
    # LoRA: rank 0 trains every weight (full fine-tuning). Rank r > 0 adds, to each target
    # projection W, float32 adapters A [in, r] and B [r, out] (B starts at zero) so the layer
    # computes x W + (alpha / r) x A B; only the adapters train and the base is frozen.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self):
        # A JSON round trip (checkpoint metadata) gives a list; the config must stay hashable.
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        problems = []
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_kv_heads > 0 and self.num_heads % self.num_kv_heads:
            problems.append(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            problems.append(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            problems.append(f"model_type must be one of {SUPPORTED_MODEL_TYPES}, got {self.model_type!r}")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                problems.append(f"{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.lora_rank < 0:
            problems.append(f"lora_rank must be >= 0 (0 = full fine-tuning), got {self.lora_rank}")
        if self.lora_rank > 0:
            unknown = [t for t in self.lora_targets if t not in LORA_TARGETS]
            if unknown or not self.lora_targets:
                problems.append(f"lora_targets must be a non-empty subset of {LORA_TARGETS}, got {self.lora_targets}")
            if len(set(self.lora_targets)) != len(self.lora_targets):
                problems.append(f"lora_targets lists a projection twice: {self.lora_targets}")
            if not self.lora_alpha > 0:
                problems.append(f"lora_alpha must be > 0, got {self.lora_alpha}")
        if problems:
            raise ValueError("invalid ModelConfig: " + "; ".join(problems))

    @property
    def lora(self) -> bool:
        """LoRA adapters train over a frozen base (lora_rank > 0)."""
        return self.lora_rank > 0

    @property
    def lora_scale(self) -> float:
        """The adapters' factor alpha / r (PEFT's `scaling`)."""
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    @property
    def attention_bias(self) -> bool:
        """Biases on the q, k and v projections (Qwen2; Qwen3 has none)."""
        return self.model_type == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """RMSNorm on each query and key head before rope (Qwen3)."""
        return self.model_type == "qwen3"

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        d, f, h, k, hd = self.hidden_size, self.intermediate_size, self.num_heads, self.num_kv_heads, self.head_dim
        per_layer = 2 * d + d * h * hd + 2 * d * k * hd + h * hd * d + 3 * d * f
        if self.attention_bias:
            per_layer += h * hd + 2 * k * hd
        if self.qk_norm:
            per_layer += 2 * hd
        head = 0 if self.tie_word_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.num_layers * per_layer + d + head

    def lora_io(self, target: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(input dims, output dims) of a target projection's kernel, as our module stores it."""
        d, f, h, k, hd = self.hidden_size, self.intermediate_size, self.num_heads, self.num_kv_heads, self.head_dim
        return {"q": ((d,), (h, hd)), "k": ((d,), (k, hd)), "v": ((d,), (k, hd)), "o": ((h, hd), (d,)),
                "gate": ((d,), (f,)), "up": ((d,), (f,)), "down": ((f,), (d,))}[target]

    def num_lora_params(self) -> int:
        """Adapter parameters: r x (in + out) per target projection per layer."""
        total = 0
        for t in self.lora_targets if self.lora else ():
            ins, outs = self.lora_io(t)
            total += self.lora_rank * (math.prod(ins) + math.prod(outs))
        return self.num_layers * total

    # ----- Qwen2.5 Instruct presets (public Hugging Face config values) -----
    @classmethod
    def qwen2_5_0_5b(cls, **kw) -> ModelConfig:
        return cls(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                   num_heads=14, num_kv_heads=2, head_dim=64, tie_word_embeddings=True, **kw)

    @classmethod
    def qwen2_5_1_5b(cls, **kw) -> ModelConfig:
        return cls(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                   num_heads=12, num_kv_heads=2, head_dim=128, tie_word_embeddings=True, **kw)

    @classmethod
    def qwen2_5_3b(cls, **kw) -> ModelConfig:
        return cls(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_layers=36,
                   num_heads=16, num_kv_heads=2, head_dim=128, tie_word_embeddings=True, **kw)

    @classmethod
    def qwen2_5_7b(cls, **kw) -> ModelConfig:
        return cls(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                   num_heads=28, num_kv_heads=4, head_dim=128, tie_word_embeddings=False, **kw)

    @classmethod
    def qwen2_5_14b(cls, **kw) -> ModelConfig:
        return cls(vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_layers=48,
                   num_heads=40, num_kv_heads=8, head_dim=128, tie_word_embeddings=False,
                   rms_norm_eps=1e-5, **kw)

    # ----- Qwen3 dense presets (public Hugging Face config values) -----
    @classmethod
    def _qwen3(cls, **kw) -> ModelConfig:
        base = dict(vocab_size=151936, head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                    max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645,
                    model_type="qwen3")
        base.update(kw)
        return cls(**base)

    @classmethod
    def qwen3_0_6b(cls, **kw) -> ModelConfig:
        return cls._qwen3(**{**dict(hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                                    num_kv_heads=8, tie_word_embeddings=True), **kw})

    @classmethod
    def qwen3_1_7b(cls, **kw) -> ModelConfig:
        return cls._qwen3(**{**dict(hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16,
                                    num_kv_heads=8, tie_word_embeddings=True), **kw})

    @classmethod
    def qwen3_4b(cls, **kw) -> ModelConfig:
        return cls._qwen3(**{**dict(hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
                                    num_kv_heads=8, tie_word_embeddings=True), **kw})

    @classmethod
    def qwen3_8b(cls, **kw) -> ModelConfig:
        return cls._qwen3(**{**dict(hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
                                    num_kv_heads=8, tie_word_embeddings=False), **kw})

    @classmethod
    def qwen3_14b(cls, **kw) -> ModelConfig:
        return cls._qwen3(**{**dict(hidden_size=5120, intermediate_size=17408, num_layers=40, num_heads=40,
                                    num_kv_heads=8, tie_word_embeddings=False), **kw})

    # ----- tiny presets for tests and the embedded default -----
    @classmethod
    def tiny(cls, **kw) -> ModelConfig:
        base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, tie_word_embeddings=True, max_position_embeddings=2048,
                    bos_token_id=0, eos_token_id=1)
        base.update(kw)
        return cls(**base)

    @classmethod
    def tiny_untied(cls, **kw) -> ModelConfig:
        return cls.tiny(**{"tie_word_embeddings": False, **kw})

    PRESETS = ("qwen2_5_0_5b", "qwen2_5_1_5b", "qwen2_5_3b", "qwen2_5_7b", "qwen2_5_14b",
               "qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b", "qwen3_14b", "tiny", "tiny_untied")

    @classmethod
    def from_preset(cls, name: str, **kw) -> ModelConfig:
        key = name.replace(".", "_").replace("-", "_").lower()
        if key not in cls.PRESETS:
            raise ValueError(f"unknown model preset {name!r}; expected one of {cls.PRESETS}")
        return getattr(cls, key)(**kw)

    # ----- Hugging Face config.json -----
    @classmethod
    def from_hf_config(cls, hf: dict[str, Any] | str | os.PathLike, **kw) -> ModelConfig:
        """Build from a HF `config.json` dict, a path to one, or a model directory."""
        source = "config dict"
        if not isinstance(hf, dict):
            path = os.fspath(hf)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            source = path
            if not os.path.exists(path):
                raise FileNotFoundError(f"no config.json at {path}")
            with open(path, encoding="utf-8") as f:
                try:
                    hf = json.load(f)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path} is not valid JSON: {e}") from e
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r} in {source}; memsearcher-jax supports {SUPPORTED_MODEL_TYPES}")
        if hf.get("use_sliding_window"):
            raise ValueError(f"{source}: use_sliding_window=true is not supported (Qwen2.5 and Qwen3 ship it disabled)")
        if model_type == "qwen3" and hf.get("attention_bias"):
            raise ValueError(f"{source}: attention_bias=true is not supported for qwen3 (the released Qwen3 "
                             "dense checkpoints have no attention biases)")
        if hf.get("rope_scaling"):
            raise ValueError(f"{source}: rope_scaling {hf['rope_scaling']!r} is not supported")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in hf]
        if missing:
            raise ValueError(f"{source} lacks required keys {missing}")
        eos = hf.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        eos = 151645 if eos is None else eos
        rope_theta = hf.get("rope_theta")
        if rope_theta is None:  # transformers 5 may nest it under rope_parameters
            rope_theta = (hf.get("rope_parameters") or {}).get("rope_theta", 1_000_000.0)
        fields = dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
            rope_theta=float(rope_theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
            bos_token_id=int(hf.get("bos_token_id") if hf.get("bos_token_id") is not None else 151643),
            eos_token_id=int(eos),
            model_type=model_type,
        )
        fields.update(kw)
        return cls(**fields)

    def to_hf_config(self, torch_dtype: str | None = None) -> dict[str, Any]:
        """A `config.json` that transformers' Qwen2ForCausalLM or Qwen3ForCausalLM (by model_type)
        and vLLM-style loaders accept."""
        dtype = torch_dtype or self.param_dtype
        out = {
            "architectures": ["Qwen3ForCausalLM" if self.model_type == "qwen3" else "Qwen2ForCausalLM"],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "max_window_layers": self.num_layers,
            "use_sliding_window": False,
            "sliding_window": None,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": dtype,
        }
        if self.model_type == "qwen3":
            out["attention_bias"] = False
        return out
