"""Qwen2.5-7B-Instruct, MemSearcher recipe (B=256, G=5) on v4-32.

    memsearcher-jax plan --config configs/recipe_qwen2_5_7b_v4_32.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 16 chips x 32 GiB on 4 hosts of 4 chips: does NOT fit, even at one row per sampler call (~1.1x): f32
    # master weights, an f32 reference and the sampler's own f32 copy (~7 GiB at tp=4) are ~14 GiB per chip
    # before the update's ~18 GiB; 256 rows per call add the prefill's attention scores (~51x).
    # Needs a bf16 reference or sampler copy, or a v4-64.
    c = recipe("qwen2_5_7b", "v4_32", data=1, fsdp=4, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=4, logprob_batch_size=4)
    c.sampler.batch_size = 256  # rollout rows per sampler call (a power of two, the sampler's own bucket)
    c.hardware.fits_expected = False  # the planner says so; kept to show why
    return c
