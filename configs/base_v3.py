"""The reading base, third version (reading_v3, shipped until 2026-11-29; reading_v7 replaced it):
base_v2's curriculum on a model twice as wide, trained on an accelerator on ~4x as many rows.

    memsearcher-jax pretrain --config configs/base_v3.py --config.train.output_dir=runs/base_v3

Resumes an interrupted run from its last checkpoint (every 500 steps); from an empty output_dir it
rebuilds the vocabulary, the init and every row from the seeds (rows depend on (seed, step) only).

What changes from configs/base_v2.py, and why (docs/experiments.md, 2026-11-26):
- Width 256 (8 heads of 32, 4 KV heads, MLP 768), still 4 layers: 4 x 128 plateaued at 91% at 2
  passages and 68% at 8 on reserved names, its misses binding errors between same-kind values.
  ~4.1M parameters, 8.2 MB in bf16 (the limit is ~10 MB).
- More rows: batch 64 in phase 1 and 32 after (base_v2: 32 and 16), 9600 steps (base_v2: 4300).
  That is ~7x the CPU budget of base_v2, so it is sized for a GPU (minutes there, a day here).
- Data built in 12 worker processes (`train.data_workers`; the same rows as one thread) and packed
  to each phase's max_len (`train.pack_to_max_len`: ~13 compiled shapes instead of ~30).
- The phases keep base_v2's mixes; their boundaries scale with the step count.
"""
import base_v2  # beside this file (the config loader puts its folder on sys.path)
import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = base_v2.get_config()

    c.model.hidden_size = 256
    c.model.intermediate_size = 768
    c.model.num_heads = 8
    c.model.num_kv_heads = 4
    c.model.head_dim = 32

    c.first_phase.steps = 2000
    c.first_phase.batch_size = 64

    c.third_phase.start = 9000

    c.train.steps = 9600
    c.train.batch_size = 32
    c.train.warmup = 300
    c.train.decay_steps = 9000
    c.train.output_dir = "runs/base_v3"
    c.train.save_every = 500
    c.train.probe_every = 1000
    c.train.log_every = 100
    c.train.data_workers = 12
    c.train.pack_to_max_len = True
    return c
