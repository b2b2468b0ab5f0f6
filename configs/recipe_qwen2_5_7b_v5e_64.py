"""Qwen2.5-7B-Instruct, MemSearcher recipe (B=256, G=5) on v5e-64.

    memsearcher-jax plan --config configs/recipe_qwen2_5_7b_v5e_64.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 16 GiB on 16 hosts of 4 chips: does NOT fit, even at one row per sampler call (~1.6x): the
    # sampler's own f32 copy (~7 GiB at tp=4, the most a host allows) is held twice while update_params
    # rebuilds it, on top of ~9 GiB persistent; 256 rows per call add the prefill's attention scores.
    # Use v5p, or a bf16 sampler copy.
    c = recipe("qwen2_5_7b", "v5e_64", data=1, fsdp=16, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=16, logprob_batch_size=16)
    c.sampler.batch_size = 256  # rollout rows per sampler call (a power of two, the sampler's own bucket)
    c.hardware.fits_expected = False  # the planner says so; kept to show why
    return c
