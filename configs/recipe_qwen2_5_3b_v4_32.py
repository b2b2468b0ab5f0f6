"""Qwen2.5-3B-Instruct, MemSearcher recipe (B=256, G=5) on v4-32.

    memsearcher-jax plan --config configs/recipe_qwen2_5_3b_v4_32.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 16 chips x 32 GiB on 4 hosts of 4 chips: tp=4 (the chips of a host) splits the f32 logits [row, 8K, V]
    # four ways and fsdp=4 the weights. Fits at ~66% of usable, peak in the rollout.
    c = recipe("qwen2_5_3b", "v4_32", data=1, fsdp=4, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=4, logprob_batch_size=4)
    # Rollout: each host samples its 320 rows on its own 4 chips (mesh 1x1x4; the 2 KV heads do not split
    # 4 ways, so every chip holds the call's whole cache): ~0.30 GiB of cache and ~0.6 GiB of prefill
    # per row per chip at 8K tokens: 16 rows per call (20 calls per generation phase); 32 needs ~116%.
    c.sampler.batch_size = 16  # rows per sampler call (a power of two: the sampler's own bucket)
    return c
