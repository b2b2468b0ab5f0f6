"""Qwen2.5-7B-Instruct, MemSearcher recipe (B=256, G=5) on v5p-128.

    memsearcher-jax plan --config configs/recipe_qwen2_5_7b_v5p_128.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 95 GiB on 16 hosts of 4 chips: tp=4 (4 KV heads, 28 heads; the chips of a host) and
    # fsdp=16. Fits at ~56% of usable, peak in the rollout.
    c = recipe("qwen2_5_7b", "v5p_128", data=1, fsdp=16, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=16, logprob_batch_size=16)
    # Rollout: each host samples its 80 rows on its own 4 chips (mesh 1x1x4): ~0.12 GiB of cache and
    # ~0.55 GiB of prefill (grid K/V, mask, 512-query attention blocks) per row per chip at 8K tokens:
    # 64 rows per call (2 calls per generation phase); 128 would need ~106%.
    c.sampler.batch_size = 64  # rows per sampler call (a power of two: the sampler's own bucket)
    return c
