"""Qwen2.5-3B-Instruct, MemSearcher recipe (B=256, G=5) on v5e-64.

    memsearcher-jax plan --config configs/recipe_qwen2_5_3b_v5e_64.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 16 GiB, the tightest pod: tp=8 cuts the sampler's TP-only f32 copy and the logits 8 ways; fsdp=8 splits the batch; 128-row rollout chunks keep the cache (split over fsdp only: 2 KV heads) at ~5 GiB.
    c = recipe("qwen2_5_3b", "v5e_64", data=1, fsdp=8, tp=8,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=8, logprob_batch_size=8)
    c.sampler.batch_size = 128  # rollout rows per sampler call (B*G=1280 in 10; a power of two, the sampler's own bucket)
    return c
