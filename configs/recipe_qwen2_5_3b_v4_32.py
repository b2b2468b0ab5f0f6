"""Qwen2.5-3B-Instruct, MemSearcher recipe (B=256, G=5) on v4-32.

    memsearcher-jax plan --config configs/recipe_qwen2_5_3b_v4_32.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 16 chips x 32 GiB. tp=4 splits the f32 logits [row, 8K, V] four ways and fsdp=4 the weights; the cache (2 KV heads) splits over fsdp only, so rollouts run 128 rows per sampler call.
    c = recipe("qwen2_5_3b", "v4_32", data=1, fsdp=4, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=4, logprob_batch_size=4)
    c.sampler.batch_size = 128  # rollout rows per sampler call (B*G=1280 in 10; a power of two, the sampler's own bucket)
    return c
