"""Qwen2.5-7B-Instruct, MemSearcher recipe (B=256, G=5) on v5e-64.

    memsearcher-jax plan --config configs/recipe_qwen2_5_7b_v5e_64.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 16 GiB on 16 hosts of 4 chips: does NOT fit, even at one row per sampler call (~1.3x): the
    # sampler's own bf16 copy (~3.5 GiB at tp=4, the most a host allows) on top of ~1.8 GiB of sharded
    # f32 state, then the update's ~14 GiB of activations and logits at 8K tokens. Use v5p.
    c = recipe("qwen2_5_7b", "v5e_64", data=1, fsdp=16, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=16, logprob_batch_size=16)
    c.sampler.batch_size = 16  # rows per sampler call; more would make the rollout the peak
    c.hardware.fits_expected = False  # the planner says so; kept to show why
    return c
