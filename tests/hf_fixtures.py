"""Tiny random Hugging Face Qwen2 checkpoints, built with transformers + torch (test extra)."""
from __future__ import annotations

import numpy as np

BASE_KW = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=True,
               max_position_embeddings=512, bos_token_id=0, eos_token_id=1, pad_token_id=0)


def _write_random(model_cls, config_cls, out_dir: str, seed: int, std: float, norms_near_one: bool, kw: dict):
    import torch

    torch.manual_seed(seed)
    model = model_cls(config_cls(**kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if norms_near_one and "norm" in name:
                p.copy_(1.0 + std * torch.randn_like(p))
            else:
                p.normal_(0.0, std)
        if kw["tie_word_embeddings"]:
            model.tie_weights()
    model.save_pretrained(out_dir)
    return model


def make_hf_qwen2(out_dir: str, *, seed: int = 0, std: float = 0.1, **overrides):
    """Write a random `Qwen2ForCausalLM` to out_dir (safetensors + config) and return it (eval mode)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _write_random(Qwen2ForCausalLM, Qwen2Config, out_dir, seed, std, False, {**BASE_KW, **overrides})


def make_hf_qwen3(out_dir: str, *, seed: int = 0, std: float = 0.1, **overrides):
    """Write a random `Qwen3ForCausalLM` to out_dir and return it (eval mode). Norm weights are
    1 + noise (q/k norms near 0 would flatten attention), the rest N(0, std)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return _write_random(Qwen3ForCausalLM, Qwen3Config, out_dir, seed, std, True,
                         {**BASE_KW, "head_dim": 16, **overrides})


def torch_logits(model, ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
    import torch

    with torch.no_grad():
        kw = {}
        if attention_mask is not None:
            am = torch.tensor(attention_mask)
            kw["attention_mask"] = am
            kw["position_ids"] = torch.clamp(am.long().cumsum(-1) - 1, min=0)
        return model(torch.tensor(ids), **kw).logits.float().numpy()
