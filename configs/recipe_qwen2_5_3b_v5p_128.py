"""Qwen2.5-3B-Instruct, MemSearcher recipe (B=256, G=5) on v5p-128.

    memsearcher-jax plan --config configs/recipe_qwen2_5_3b_v5p_128.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 95 GiB: memory is plentiful, so tp=2 (the 2 KV heads) and fsdp=32 for the most data parallelism; the whole B*G=1280 rollout batch fits in one pass.
    c = recipe("qwen2_5_3b", "v5p_128", data=1, fsdp=32, tp=2,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=32, logprob_batch_size=32)
    return c
