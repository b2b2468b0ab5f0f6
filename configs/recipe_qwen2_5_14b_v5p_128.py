"""Qwen2.5-14B-Instruct, MemSearcher recipe (B=256, G=5) on v5p-128.

    memsearcher-jax plan --config configs/recipe_qwen2_5_14b_v5p_128.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 95 GiB on 16 hosts of 4 chips: tp=4, the most a host holds (global_mesh keeps tensor
    # parallelism inside a host; 40 heads and 8 KV heads divide by 4), and fsdp=16. Fits at ~61% of
    # usable, peak in the rollout.
    c = recipe("qwen2_5_14b", "v5p_128", data=1, fsdp=16, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=16, logprob_batch_size=16)
    # Rollout: each host samples its 80 rows on its own 4 chips (mesh 1x1x4): ~0.40 GiB of cache and
    # ~0.9 GiB of prefill (grid K/V, mask, 512-query attention blocks) per row per chip at 8K tokens:
    # 32 rows per call (3 calls per generation phase); 64 would need ~110%.
    c.sampler.batch_size = 32  # rows per sampler call (a power of two: the sampler's own bucket)
    return c
