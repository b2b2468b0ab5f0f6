"""Qwen2.5-14B-Instruct, MemSearcher recipe (B=256, G=5) on v5e-64.

    memsearcher-jax plan --config configs/recipe_qwen2_5_14b_v5e_64.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 16 GiB: does NOT fit (~1.65x): the TP-only sampler copy (7 GiB at tp=8) plus the update leave no room; use v5p-128.
    c = recipe("qwen2_5_14b", "v5e_64", data=1, fsdp=8, tp=8,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=8, logprob_batch_size=8)
    c.sampler.batch_size = 128  # rollout rows per sampler call (B*G=1280 in 10; a power of two, the sampler's own bucket)
    c.hardware.fits_expected = False  # the planner says so; kept to show why
    return c
