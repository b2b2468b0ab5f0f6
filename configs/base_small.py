"""An abandoned second base (4 x 256; its run never formed the copy circuit and was lost, docs/experiments.md
2026-11-25/26): kept because the diary names its recipe. reading_v2 is made by configs/base_v2.py.

    memsearcher-jax pretrain --config configs/base_small.py --config.train.output_dir=/root/runs/base_small

The same command resumes an interrupted run (checkpoints every 100 steps under output_dir) and,
run from an empty output_dir, reproduces the weights from scratch: the vocabulary, the init and
every curriculum row depend only on the seeds below (rows on (seed, step)).

Why these choices (docs/experiments.md, 2026-11-24):
- Width. The first base (4 layers x 128) plateaued at 78-83% on its probe and 73-75% on fresh
  items; its misses were binding errors (a value of the right kind copied from the wrong entity).
  This one is 4 layers x 256 (4 heads of 64): twice the width in the same depth, ~8 MB of bf16
  weights, so the directory stays under ~10 MB.
- Two phases. Steps 0..first_phase.steps train on short rows only (repeat and recall drills,
  2-3-passage cloze, max 512 tokens): the copy skill forms there (the first base's phase change
  came from repeat drills) at a quarter of the cost of a 1024-token step. Then the full mix at
  up to 1024 tokens: `long` (4-16 passages, ~250-900 tokens, the asked passage anywhere),
  `bind` (several entities of one type, one relation asked about several of them: the wrong
  entity's value of the right kind is always there), `multi` (`<question> q1; q2 </question>`
  answered `\\boxed{a1; a2}`, the multi-objective format of `world.objectives`).
- Agent episodes in every workflow's format, in equal shares (phase 2 only: `demo` .2 of the
  rows; memsearcher, react, mem1 and memory_ops in turn, at 1 and 2 objectives: eight kinds of
  episode, one eighth of the episodes each). The choice was that or none. The run began with
  none (only the memsearcher demonstrator existed then; phase 1 has no episodes either way), and
  was switched before phase 2 began (2026-11-25, at step 900; phase 1's rows are the same under
  both settings, `test_demo_formats_change_nothing_without_demo_rows`) because none failed the
  main job: from the step-800 checkpoint, the default's 150-step warm start left the agent
  answering without ever searching (0.00 searches per trajectory, format errors 20%, SFT loss
  0.39 where the first base reached 0.06) and GRPO had nothing to reinforce (held-out EM 1 -> 0);
  teaching each format from nothing would need a longer warm start in every job, which the
  main job's time budget does not have. Equal shares keep the base fair: every workflow's
  markup seen equally often, none favoured (the first base saw 20% memsearcher demos only).
- Lengths: 16 passages are ~900 tokens with this vocabulary (every name and value one token;
  8 passages ~450): the react histories of the workflow comparison (1-2K tokens) are the reason
  for 1024, the longest a 2-core step can afford.
"""
import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(__file__))
from base_tiny import get_config as tiny_config  # noqa: E402


def get_config() -> ml_collections.ConfigDict:
    c = tiny_config()

    c.model.hidden_size = 256
    c.model.intermediate_size = 768
    c.model.num_layers = 4
    c.model.num_heads = 4            # 4 heads of 64 (not 8 of 32): half the attention scores' memory and time
                                     # at 1024 tokens
    c.model.num_kv_heads = 2
    c.model.head_dim = 64
    c.model.remat = False            # packed rows fit without recomputing layers (3.2-3.6 GB peak on phase-2
                                     # batches, measured 2026-11-25); remat cost 15% of a step. The run
                                     # began with remat on (to step 1200): same math, other rounding
    c.model.train_query_block = 128  # attention by 128-query blocks against the keys up to each block's
                                     # end: same result, (n + 1) / 2n of the scores; a phase-2 step
                                     # (7 x 1024) 6.92 -> 4.60 s (64: 4.42 s, 256: 5.04 s; 2026-11-25)

    # Phase 1: short rows only, until the copy skill forms.
    c.first_phase = ml_collections.ConfigDict()
    c.first_phase.steps = 1500
    c.first_phase.max_len = 512
    c.first_phase.batch_size = 64
    c.first_phase.repeat = 0.3
    c.first_phase.recall = 0.2
    c.first_phase.cloze = 0.5

    # Phase 2 (to train.steps): the full mix.
    c.curriculum.repeat = 0.05
    c.curriculum.recall = 0.05
    c.curriculum.cloze = 0.15
    c.curriculum.demo = 0.2          # agent episodes, every workflow's format in equal shares: see the docstring
    c.curriculum.long = 0.25
    c.curriculum.bind = 0.25
    c.curriculum.multi = 0.05
    c.curriculum.name_copy = 0.0     # copy targets on repeated names in context rows (off, as this run
                                     # trained; the A/B from step 2300: docs/experiments.md 2026-11-25)
    c.curriculum.demo_workflows = ("memsearcher", "react", "mem1", "memory_ops")
    c.curriculum.demo_objectives = (1, 2)
    c.curriculum.long_passages = (4, 16)
    c.curriculum.bind_entities = (2, 8)

    # Phase 3 (from step 3200): the copy circuit, measured by the progress probe's `probe_copy`,
    # had never formed (repeat drill 5-13% where the first base copies 100%; docs/experiments.md
    # 2026-11-25, second session) and phase 2's probe plateaued at 58-64%. So repeat drills come
    # back at .4 of the rows and context rows also train on repeated names (name_copy .25: +5-7
    # points in a 200-step A/B from step 2300). The rest of the mix keeps phase 2's proportions.
    c.third_phase = ml_collections.ConfigDict()
    c.third_phase.start = 3200
    c.third_phase.repeat = 0.4
    c.third_phase.recall = 0.05
    c.third_phase.cloze = 0.1
    c.third_phase.demo = 0.1
    c.third_phase.long = 0.15
    c.third_phase.bind = 0.15
    c.third_phase.multi = 0.05
    c.third_phase.name_copy = 0.25

    c.train.steps = 6000
    c.train.max_len = 1024
    c.train.batch_size = 16          # phase 2: 16 rows of up to 1024 tokens (~ the tokens of phase 1's 64 short rows)
    c.train.pack = True              # rows packed several to a sequence: ~1.3x (phase 1) and ~1.8x
                                     # (phase 2) fewer padded tokens per step than one row per padded row
    c.train.learning_rate = 1e-3
    c.train.warmup = 200
    c.train.output_dir = "runs/base_small"
    c.train.export_dir = ""
    c.train.probe_items = 256        # per progress set (2, 8, 16 passages, multi), every probe_every steps
    c.train.final_probe_items = 512  # per final set, measured once on the exported bf16 weights
    c.train.log_every = 10           # a loss / seconds-per-step line in the log between probes
    # What changed while the shipped run ran (recorded in the manifest with this config). None
    # changes what a from-scratch run of this file computes beyond rounding.
    c.run_notes = (
        "2026-11-24 13:44 UTC: started from step 0 with packed rows (docs/experiments.md).",
        "2026-11-25, at step 1000 (phase 1, before any phase-2 step): phase 2's mix set to its "
        "current values with agent episodes in every workflow's format; phase 1's rows are the same "
        "under both settings.",
        "2026-11-25, at step 1200: the head runs only at the loss slots and remat is off (same math, "
        "other rounding); steps 0-1200 ran with the head over every slot and per-layer remat.",
        "2026-11-25, at step 1900: attention in 128-query causal blocks (train_query_block; same math, "
        "other rounding); earlier steps attended all keys at once.",
        "2026-11-25, at step 3200: phase 3 (third_phase) added: repeat drills back at .4 and name_copy .25, "
        "because the copy circuit had not formed; steps before 3200 are unchanged.",
    )
    return c
