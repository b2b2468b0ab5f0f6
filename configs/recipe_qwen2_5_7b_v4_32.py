"""Qwen2.5-7B-Instruct, MemSearcher recipe (B=256, G=5) on v4-32.

    memsearcher-jax plan --config configs/recipe_qwen2_5_7b_v4_32.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 16 chips x 32 GiB on 4 hosts of 4 chips: fits, with no slack (~99% of usable, peak in the update):
    # f32 master weights, an f32 reference, the moments and the sampler's own bf16 copy (~3.5 GiB at
    # tp=4) are ~10.6 GiB per chip before the update's ~18 GiB. Watch the first step's memory; a bf16
    # reference or a v4-64 gives room.
    c = recipe("qwen2_5_7b", "v4_32", data=1, fsdp=4, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=4, logprob_batch_size=4)
    # Rollout: each host samples its 320 rows on its own 4 chips (mesh 1x1x4): ~0.12 GiB of cache and
    # ~0.55 GiB of prefill per row per chip at 8K tokens: 16 rows per call (20 calls per generation
    # phase); 32 would make the rollout the peak at ~111%.
    c.sampler.batch_size = 16  # rows per sampler call (a power of two: the sampler's own bucket)
    return c
