"""Qwen2.5-14B-Instruct, MemSearcher recipe (B=256, G=5) on h100-8.

    memsearcher-jax plan --config configs/recipe_qwen2_5_14b_h100_8.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 8 GPUs x 80 GiB: tp=8 (8 KV heads, 40 heads); f32 params + reference + moments are ~28 GiB per GPU
    # and the sampler's own per-layer f32 copy ~7 GiB. Fits at ~95% of usable, peak in the rollout.
    c = recipe("qwen2_5_14b", "h100_8", data=1, fsdp=1, tp=8,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=1, logprob_batch_size=1)
    # Rollout: with fsdp=1 every GPU holds every row of a call, and the prefill's unchunked attention
    # scores cost ~4 GiB per row per GPU at 8K tokens: 8 rows per call (160 calls per generation phase).
    c.sampler.batch_size = 8  # rows per sampler call (a power of two: the sampler's own bucket)
    return c
