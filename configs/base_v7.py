"""The reading base, seventh recipe (reading_v7, shipped 2026-11-29 until reading_v8,
configs/base_v8.py, which is this run and one phase more, replaced it the same day):
base_v3's model and phases on a world whose works_for and product sentences put their value further
from the subject, with a phase 1 that binds works_for.

    memsearcher-jax pretrain --config configs/base_v7.py --config.train.output_dir=runs/base_v7

Resumes an interrupted run from its last checkpoint (every 100 steps); from an empty output_dir it
rebuilds the vocabulary, the init and every row from the seeds (rows depend on (seed, step) only).

What changes from configs/base_v3.py, and why (docs/experiments.md, 2026-11-27 and 2026-11-28):
- The world in wording "v2" (`vocab.wording`; data/synthetic.py `REWORDED`): "{s} works for the
  company called {a}." (v1: "{s} works for {a}.") and "{s} makes the product called {a}." (v1:
  "{s} makes {a}."). reading_v3 never bound works_for (its answer is a pick between the employers in
  the context); the reworded works_for sentence bound on two small seeds and in base_v6 (93-97% of
  pairs). product was the one relation base_v6 left unbound through step 3500 (0-4% of pairs): its
  sentence had the shape the old works_for sentence had (subject first, value two tokens on), so it
  gets the same rewording (not tested alone). The base's vocabulary records the wording, and every
  world built for the base (the main job's included) is written in it.
- Phase 1 as the arm that bound works_for at this width (w256): 1200 steps at batch 32, warm-up
  200, the cosine at its floor (1e-4) from step 1201, so phase 2 runs at the floor. base_v5 kept
  base_v3's phase 1 (2000 steps at batch 64 near the peak rate) and bound no works_for pair.
- A final probe of 1024 items a set (base_v3: 512), set at step 7000 before any final item was read: at
  512 a relation has ~45 questions a length, so one miss moves it ~2 points and the "90% on every
  relation" target would be decided by noise (docs/experiments.md, 2026-11-28 twentieth session).
  Only the exported base's probe reads it; the weights do not depend on it.
- Two phases added after the run ended at step 9600 (docs/experiments.md, 2026-11-28 twenty-first
  session). Phase 3 (base_v3's: ~86% agent episodes at a constant 3e-4, three times the rate phase 2
  ran at) cost reading_v3 1.6 points; here it took the reading over all lengths from 96.5% (step 9000)
  to 74.4% on the final probe (born_in 27% at 16 passages). So a fourth phase is phase 2 again at
  phase 2's rate (1e-4), from the weights phase 3 left (400 steps: the progress probe was back at
  step 9000's by step 9800-10000), and a fifth phase is phase 3's mix at that same rate (400 steps).
  The config keeps phase 3 as it ran, so it reproduces every step from scratch.
"""
import base_v3  # beside this file (the config loader puts its folder on sys.path)
import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = base_v3.get_config()
    c.vocab.wording = "v2"
    c.first_phase.steps = 1200
    c.first_phase.batch_size = 32
    c.train.warmup = 200
    c.train.decay_steps = 1201
    c.train.save_every = 100
    c.train.final_probe_items = 1024
    c.fourth_phase = ml_collections.ConfigDict({"start": 9600, "learning_rate": 1e-4})  # phase 2's mix and rate
    c.fifth_phase = ml_collections.ConfigDict(c.third_phase.to_dict())                  # phase 3's mix at 1e-4
    c.fifth_phase.start = 10000
    c.fifth_phase.learning_rate = 1e-4
    c.train.steps = 10400
    c.train.output_dir = "runs/base_v7"
    return c
