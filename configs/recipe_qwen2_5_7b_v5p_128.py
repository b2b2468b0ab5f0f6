"""Qwen2.5-7B-Instruct, MemSearcher recipe (B=256, G=5) on v5p-128.

    memsearcher-jax plan --config configs/recipe_qwen2_5_7b_v5p_128.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 95 GiB: tp=4 (4 KV heads, 28 heads) and fsdp=16; the whole rollout batch fits in one pass.
    c = recipe("qwen2_5_7b", "v5p_128", data=1, fsdp=16, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=16, logprob_batch_size=16)
    return c
