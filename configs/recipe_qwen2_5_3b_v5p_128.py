"""Qwen2.5-3B-Instruct, MemSearcher recipe (B=256, G=5) on v5p-128.

    memsearcher-jax plan --config configs/recipe_qwen2_5_3b_v5p_128.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 95 GiB on 16 hosts of 4 chips: memory is plentiful, so tp=2 (the 2 KV heads) and fsdp=32
    # for the most data parallelism. Fits at ~61% of usable, peak in the rollout.
    c = recipe("qwen2_5_3b", "v5p_128", data=1, fsdp=32, tp=2,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=32, logprob_batch_size=32)
    # Rollout: each host samples its 80 rows on its own 4 chips (mesh 1x2x2, rows split 2 ways): ~0.18 GiB
    # of cache and ~0.6 GiB of prefill per row per chip at 8K tokens, so all 80 rows go in one call
    # (padded to the 128-row bucket).
    c.sampler.batch_size = 128  # rows per sampler call (a power of two: the sampler's own bucket)
    return c
