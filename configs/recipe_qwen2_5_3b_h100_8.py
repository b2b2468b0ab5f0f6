"""Qwen2.5-3B-Instruct, MemSearcher recipe (B=256, G=5) on h100-8.

    memsearcher-jax plan --config configs/recipe_qwen2_5_3b_h100_8.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 8 GPUs x 80 GiB on one node (NVLink): fsdp=4 x tp=2; tp=2 matches the 2 KV heads so the cache splits
    # 8 ways. Fits at ~79% of usable, peak in the rollout.
    c = recipe("qwen2_5_3b", "h100_8", data=1, fsdp=4, tp=2,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=4, logprob_batch_size=4)
    # Rollout: rows split over the 4 fsdp shards, ~0.15 GiB of cache and ~0.6 GiB of prefill (grid
    # K/V, mask, 512-query attention blocks) per row per GPU at 8K tokens: 256 rows per call (5 calls
    # per generation phase), at ~79% of usable, the most the prefill estimate's error leaves room for.
    c.sampler.batch_size = 256  # rows per sampler call (a power of two: the sampler's own bucket)
    return c
