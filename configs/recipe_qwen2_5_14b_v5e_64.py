"""Qwen2.5-14B-Instruct, MemSearcher recipe (B=256, G=5) on v5e-64.

    memsearcher-jax plan --config configs/recipe_qwen2_5_14b_v5e_64.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 16 GiB on 16 hosts of 4 chips: does NOT fit, even at one row per sampler call (~3.1x): tp is
    # capped at the 4 chips of a host (global_mesh keeps tensor parallelism inside a host), so the
    # sampler's own f32 copy alone is ~14 GiB per chip, and it is held twice while update_params rebuilds
    # it; 128 rows per call add the prefill's attention scores. Use v5p-128.
    c = recipe("qwen2_5_14b", "v5e_64", data=1, fsdp=16, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=16, logprob_batch_size=16)
    c.sampler.batch_size = 128  # rollout rows per sampler call (a power of two, the sampler's own bucket)
    c.hardware.fits_expected = False  # the planner says so; kept to show why
    return c
