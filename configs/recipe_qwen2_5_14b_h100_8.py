"""Qwen2.5-14B-Instruct, MemSearcher recipe (B=256, G=5) on h100-8.

    memsearcher-jax plan --config configs/recipe_qwen2_5_14b_h100_8.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 8 GPUs x 80 GiB: tp=8 (no separate sampler copy, the training layout is TP-only here); f32 params + reference + moments are ~28 GiB per GPU, 128-row rollout calls keep the cache at ~28 GiB: fits at ~82% of usable (see docs/scale_out.md, known gaps, for what the plan leaves out).
    c = recipe("qwen2_5_14b", "h100_8", data=1, fsdp=1, tp=8,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=1, logprob_batch_size=1)
    c.sampler.batch_size = 128  # rollout rows per sampler call (B*G=1280 in 10; a power of two, the sampler's own bucket)
    return c
