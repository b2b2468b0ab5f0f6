"""Qwen2.5-7B-Instruct, MemSearcher recipe (B=256, G=5) on h100-8.

    memsearcher-jax plan --config configs/recipe_qwen2_5_7b_h100_8.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 8 GPUs x 80 GiB: tp=4 within NVLink (4 KV heads), fsdp=2. Fits at ~57% of usable, peak in the update.
    c = recipe("qwen2_5_7b", "h100_8", data=1, fsdp=2, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=2, logprob_batch_size=2)
    # Rollout: rows split over the 2 fsdp shards, ~0.12 GiB of cache and ~0.55 GiB of prefill (grid K/V,
    # mask, 512-query attention blocks) per row per GPU at 8K tokens: 64 rows per call (20 calls per
    # generation phase); 128 would plan at ~84%, over the ~80% the prefill estimate's error allows.
    c.sampler.batch_size = 64  # rows per sampler call (a power of two: the sampler's own bucket)
    return c
