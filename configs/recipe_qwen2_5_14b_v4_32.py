"""Qwen2.5-14B-Instruct, MemSearcher recipe (B=256, G=5) on v4-32.

    memsearcher-jax plan --config configs/recipe_qwen2_5_14b_v4_32.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 16 chips x 32 GiB on 4 hosts of 4 chips: does NOT fit, even at one row per sampler call (~1.7x): tp is
    # capped at the 4 chips of a host (global_mesh keeps tensor parallelism inside a host), and 14.8B f32
    # params, reference and moments are ~14 GiB per chip next to the sampler's own bf16 copy (~7 GiB at
    # tp=4), before the update's ~27 GiB. Needs a v4-64 or larger.
    c = recipe("qwen2_5_14b", "v4_32", data=1, fsdp=4, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=4, logprob_batch_size=4)
    c.sampler.batch_size = 16  # rows per sampler call; more would make the rollout the peak
    c.hardware.fits_expected = False  # the planner says so; kept to show why
    return c
