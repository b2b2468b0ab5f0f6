"""Qwen2.5-14B-Instruct, MemSearcher recipe (B=256, G=5) on v5e-64.

    memsearcher-jax plan --config configs/recipe_qwen2_5_14b_v5e_64.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 16 GiB on 16 hosts of 4 chips: does NOT fit, even at one row per sampler call (~2.1x): tp is
    # capped at the 4 chips of a host (global_mesh keeps tensor parallelism inside a host), so the
    # sampler's own bf16 copy alone is ~7 GiB per chip next to ~3.4 GiB of sharded f32 state, and the
    # update phase adds ~20 GiB at 8K tokens. Use v5p-128.
    c = recipe("qwen2_5_14b", "v5e_64", data=1, fsdp=16, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=16, logprob_batch_size=16)
    c.sampler.batch_size = 8  # rows per sampler call; more would make the rollout the peak
    c.hardware.fits_expected = False  # the planner says so; kept to show why
    return c
