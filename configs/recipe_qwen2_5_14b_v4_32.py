"""Qwen2.5-14B-Instruct, MemSearcher recipe (B=256, G=5) on v4-32.

    memsearcher-jax plan --config configs/recipe_qwen2_5_14b_v4_32.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 16 chips x 32 GiB: does NOT fit (~1.45x): 14.8B f32 params, reference and moments alone are ~14 GiB per chip before the KV cache and activations; needs a v4-64 or larger.
    c = recipe("qwen2_5_14b", "v4_32", data=1, fsdp=2, tp=8,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=2, logprob_batch_size=2)
    c.sampler.batch_size = 128  # rollout rows per sampler call (B*G=1280 in 10; a power of two, the sampler's own bucket)
    c.hardware.fits_expected = False  # the planner says so; kept to show why
    return c
