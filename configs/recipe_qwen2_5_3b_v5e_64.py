"""Qwen2.5-3B-Instruct, MemSearcher recipe (B=256, G=5) on v5e-64.

    memsearcher-jax plan --config configs/recipe_qwen2_5_3b_v5e_64.py
"""
from _recipe_base import recipe  # configs/_recipe_base.py; the loader puts configs/ on sys.path


def get_config():
    # 64 chips x 16 GiB on 16 hosts of 4 chips, the tightest pod: tp=4, the most a host holds (global_mesh
    # keeps tensor parallelism inside a host), cuts the sampler's TP-only copy and the logits 4 ways;
    # fsdp=16 splits the weights and the batch. Fits at ~85% of usable, peak in the update.
    c = recipe("qwen2_5_3b", "v5e_64", data=1, fsdp=16, tp=4,
                # one row per (data x fsdp) shard: an 8K-token row is the activation unit
                micro_batch_size=16, logprob_batch_size=16)
    # Rollout: each host samples its 80 rows on its own 4 chips (mesh 1x1x4; the 2 KV heads do not split 4
    # ways, so every chip holds the call's whole cache): ~0.31 GiB of cache and ~0.6 GiB of prefill
    # (grid K/V, mask, 512-query attention blocks) per row per chip at 8K tokens: 8 rows per call
    # (10 calls per generation phase); 16 would need ~117%.
    c.sampler.batch_size = 8  # rows per sampler call (a power of two: the sampler's own bucket)
    return c
