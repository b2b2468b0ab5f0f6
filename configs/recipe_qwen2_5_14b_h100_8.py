"""Qwen2.5-14B-Instruct, MemSearcher recipe (B=256, G=5) on h100-8.

    memsearcher-jax plan --config configs/recipe_qwen2_5_14b_h100_8.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 8 GPUs x 80 GiB: just over (~1.01x) even with tp=8 (no separate sampler copy) and 160-row rollouts: f32 params + reference + moments + un-donated update outputs are ~52 GiB per GPU. Use 2 nodes, or donate the update's buffers.
    c = recipe("qwen2_5_14b", "h100_8", data=1, fsdp=1, tp=8,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=1, logprob_batch_size=1)
    c.sampler.batch_size = 160  # rollout rows per sampler pass (B*G=1280 in 8 passes)
    c.hardware.fits_expected = False  # the planner says so; kept to show why
    return c
