"""Qwen2.5-14B-Instruct, MemSearcher recipe (B=256, G=5) on h100-8.

    memsearcher-jax plan --config configs/recipe_qwen2_5_14b_h100_8.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 8 GPUs x 80 GiB: tp=8 (8 KV heads, 40 heads); f32 params + reference + moments are ~28 GiB per GPU
    # and the sampler's own per-layer bf16 copy ~3.4 GiB. Fits at ~87% of usable, peak in the update.
    c = recipe("qwen2_5_14b", "h100_8", data=1, fsdp=1, tp=8,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=1, logprob_batch_size=1)
    # Rollout: with fsdp=1 every GPU holds every row of a call: ~0.20 GiB of cache and ~0.5 GiB of
    # prefill (grid K/V, mask, 512-query attention blocks) per row at 8K tokens: 32 rows per call
    # (40 calls per generation phase); 64 would make the rollout the peak at ~108%.
    c.sampler.batch_size = 32  # rows per sampler call (a power of two: the sampler's own bucket)
    return c
