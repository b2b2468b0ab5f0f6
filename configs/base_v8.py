"""The reading base reading_v8 (`memsearcher_jax/bases/reading_v8`, shipped, the default's), whole.

    memsearcher-jax pretrain --config configs/base_v8.py --config.train.output_dir=runs/base_v8

From an empty output_dir this rebuilds the vocabulary, the init and every row from the seeds below
(rows depend only on (seed, step)) and reproduces reading_v8 (~13 hours on a 2-core CPU; minutes
on an accelerator); in a directory holding a run it resumes from the last checkpoint (every 100
steps). `phases` is the run's phase list, as its manifest records it
(tests/test_pretrain.py::test_base_v8_phases_are_the_shipped_manifests).

Why these choices (docs/lab/, the notes of 2026-11-26 to 2026-11-29, e.g.
docs/lab/2026-11-29-demonstrator-at-half-reading-v7-ships.md; the earlier configs are in git:
`git show e0483b8:configs/base_v7.py` and the base_v2/v3 it built on):
- Model: 4 layers x 256 (8 heads of 32, 4 KV heads, MLP 768), ~4.1M parameters, 8.1 MB in bf16.
  4 x 128 plateaued at 91% at 2 passages with binding errors between same-kind values.
- A structured init: mimetic attention (W_k starts near W_q, W_o near W_v^T) and positional heads
  (layer 0's heads 1-4 tokens back, layer 1's 5-8): binding needs content matching, which plain
  init learns very slowly. Name and value rows are a vector shared per type + a fixed code each,
  so a reserved name (never seen in pretraining) looks exactly like the names it learnt to copy.
- The world in wording "v2": "{s} works for the company called {a}." and "{s} makes the product
  called {a}." put the value further from its subject; wording "v1" never bound works_for.
- The phases:
  1. binding (0-1200): short rows, 40% bind drills, at batch 32 with the warm-up and a cosine that
     reaches its floor (1e-4) at step 1201: the arm that bound works_for at this width;
  2. reading (1200-9000): contexts to 16 passages with the asked passage anywhere, more entities
     per bind row, multi-objective rows, and agent episodes in every workflow's format in equal
     shares, at the floor;
  3. episodes (9000-9600): ~90% agent episodes, one objective, at a constant 3e-4 (after reading
     alone the default job barely learnt: its agent wrote memory from one habitual sentence);
  4. reading again (9600-10000) at 1e-4: the episodes at 3e-4 broke the reading (96.5% -> 74.4%);
  5. episodes again (10000-10400) at 1e-4: reading_v7 ended here;
  6. reading at half the rate (10400-10800, 5e-5): lifted the reading at 8 passages while keeping
     what the episodes gave the default job.
"""
import ml_collections

# Row settings of the reading phases (a phase states all of its own: nothing is inherited).
READING = {
    "mix": {"repeat": 0.1, "recall": 0.05, "cloze": 0.15, "demo": 0.15, "long": 0.2, "bind": 0.3, "multi": 0.05},
    "name_copy": 0.25,            # names seen earlier in a context row are targets at this weight
    "cloze_passages": (2, 3),     # passages per cloze row
    "cloze_questions": 4,         # questions per context row
    "long_passages": (4, 16),     # passages per long, bind and multi row (16: ~900 tokens)
    "bind_entities": (2, 8),      # same-type entities per bind row
    "recall_pairs": (4, 16),      # pairs per recall drill
    "repeat_tokens": (16, 48),    # tokens per repeat drill
    "demo_workflows": ("memsearcher", "react", "mem1", "memory_ops"),  # episodes in equal shares
    "demo_objectives": (1, 2),
    "max_len": 1024,
    "batch_size": 32,
}
# The episode phases: mostly agent episodes at one objective, every workflow alike.
EPISODES = {**READING, "mix": {"repeat": 0.0, "recall": 0.0, "cloze": 0.05, "demo": 0.9, "long": 0.05,
                               "bind": 0.05, "multi": 0.0},
            "demo_objectives": (1,)}


def _phase(name: str, start: int, learning_rate: float, rows: dict, **changes) -> dict:
    """A phase entry: its own copy of the row settings (an override of one phase touches no other)."""
    own = lambda v: dict(v) if isinstance(v, dict) else tuple(list(v)) if isinstance(v, tuple) else v
    return {"name": name, "start": start, "learning_rate": learning_rate,
            **{k: own(v) for k, v in {**rows, **changes}.items()}}


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()

    c.vocab = ml_collections.ConfigDict()
    c.vocab.seed = 0                 # names of the pools (pretrain / reserved) come from this seed
    c.vocab.bpe_size = 640           # BPE entries besides names, values and agent tags
    c.vocab.wording = "v2"           # the world's sentences (synthetic.WORDINGS); worlds built for the base use it

    c.model = ml_collections.ConfigDict()
    c.model.hidden_size = 256
    c.model.intermediate_size = 768
    c.model.num_layers = 4
    c.model.num_heads = 8
    c.model.num_kv_heads = 4
    c.model.head_dim = 32
    c.model.rope_theta = 10000.0
    c.model.init_seed = 0
    c.model.mimetic_init = 0.7       # share of W_k -> W_q and W_o -> W_v^T at init (0: plain random init)
    # Heads that start attending a fixed number of tokens back (q/k biases; one tuple per layer
    # from layer 0, one offset per head, cycled over the layer's heads).
    c.model.positional_heads = ((1, 2, 3, 4), (5, 6, 7, 8))
    c.model.positional_strength = 8.0
    c.model.remat = False
    c.model.train_query_block = 128  # attention by 128-query blocks against the keys up to each block's end
    c.model.tie_names = True         # name rows: a trained vector per type + a fixed code each
    c.model.tie_values = True        # attribute values the same way
    c.model.recode_values_on_resume = False

    c.curriculum = ml_collections.ConfigDict()   # what every phase shares
    c.curriculum.world_entities = 30
    c.curriculum.rows_per_world = 32
    c.curriculum.top_n = 2           # passages per search in episodes: the agent's default_top_n in configs/default.py

    # learning_rate 0: the warm-up + cosine of train.* below; a rate: constant from the phase's start.
    c.phases = (
        _phase("binding", 0, 0.0, READING, mix={"repeat": 0.2, "recall": 0.1, "cloze": 0.3, "bind": 0.4},
               long_passages=(2, 6), bind_entities=(2, 4), max_len=512),
        _phase("reading", 1200, 0.0, READING),
        _phase("episodes", 9000, 3e-4, EPISODES),
        _phase("reading again", 9600, 1e-4, READING),
        _phase("episodes again", 10000, 1e-4, EPISODES),
        _phase("reading at half the rate", 10400, 5e-5, READING),
    )

    c.train = ml_collections.ConfigDict()
    c.train.steps = 10800
    c.train.pack = True              # rows packed several to a sequence (same loss, less padding)
    c.train.pack_to_max_len = True   # every step of a phase packed to its max_len (few programs to compile)
    c.train.learning_rate = 1e-3     # the peak of the warm-up + cosine
    c.train.warmup = 200
    c.train.decay_steps = 1201       # the cosine reaches its floor here (0: at train.steps)
    c.train.final_lr_fraction = 0.1  # the floor: 1e-4
    c.train.weight_decay = 0.01
    c.train.min_len = 128
    c.train.compilation_cache_dir = "~/.cache/memsearcher-jax/xla-cache"
    c.train.seed = 0
    c.train.output_dir = "runs/base_v8"
    c.train.export_dir = ""          # where the finished base is written ("": output_dir/base)
    c.train.save_every = 100
    c.train.keep_period = 200        # also keep every 200th checkpoint (phase starts among them)
    c.train.probe_every = 1000
    c.train.probe_items = 256        # per progress set (2, 8, 16 passages, multi)
    c.train.final_probe_items = 1024  # per final set, measured once on the exported bf16 weights
    c.train.log_every = 100
    c.train.data_workers = 12        # processes building steps ahead (the same rows as one thread)
    c.run_notes = ()
    return c
