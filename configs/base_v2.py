"""The reading base, second version (reading_v2, shipped until 2026-11-26; reading_v3 replaced it).

    memsearcher-jax pretrain --config configs/base_v2.py --config.train.output_dir=runs/base_v2

The same command resumes an interrupted run (checkpoints every 100 steps under output_dir) and,
run from an empty output_dir, reproduces the weights from scratch: the vocabulary, the init and
every curriculum row depend only on the seeds below (rows on (seed, step)).

Why these choices (docs/experiments.md, 2026-11-26):
- Shape: 4 layers x 128, as the first base. Its main job stays as fast as before, and the
  wider 4 x 256 of the lost second run learnt no faster per CPU-second (~3x the cost per step).
- A structured init. Every earlier base learnt to match the asked relation and never to bind
  the value to its subject (same-type distractors: 59%, chance 50%); binding needs content
  matching, which plain init learns very slowly (recall drills: 4.4% after 400 steps). Two
  changes to the initial attention weights, nothing else: mimetic attention
  (`model.mimetic_init`: W_k starts near W_q and W_o near W_v^T, so heads begin by attending
  to similar content and copying it) and positional heads (`model.positional_heads`: layer 0's
  heads attend 1-4 tokens back, layer 1's 5-8, through q/k biases). Recall drills: 97% after
  400 steps; on the reading mix, 87% at 2 passages by step 700 where plain init stays at 80%.
- Binding from the start: phase 1 is 40% `bind` rows (2-4 entities of one type among 2-6
  passages, one relation asked about several of them) and name_copy targets, not the first
  base's recall/cloze mix: that mix reached its 80% at 2 passages by matching the relation and
  type only (same-type distractors: 59%, chance 50%), and a bind-heavy phase 1 reaches the same
  80% in 1250 steps at batch 32 with 41% (not 30%) at 8 passages.
- Phase 2: contexts to 16 passages (~900 tokens) with the asked passage anywhere, more entities
  per bind row, multi-objective rows, and agent episodes in every workflow's format in equal
  shares (memsearcher, react, mem1, memory_ops at 1 and 2 objectives): a base that saw no
  episodes left the default's warm start never searching (docs/experiments.md 2026-11-25), and
  one format alone would favour its workflow in the paper tables.
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()

    c.vocab = ml_collections.ConfigDict()
    c.vocab.seed = 0                 # names of the pools (pretrain / reserved) come from this seed
    c.vocab.bpe_size = 640           # BPE entries besides names, values and agent tags
    c.vocab.wording = "v1"           # the world's sentences (synthetic.WORDINGS); worlds built for the base use it

    c.model = ml_collections.ConfigDict()
    c.model.hidden_size = 128
    c.model.intermediate_size = 384
    c.model.num_layers = 4
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.head_dim = 32
    c.model.rope_theta = 10000.0
    c.model.init_seed = 0
    c.model.mimetic_init = 0.7       # share of W_k -> W_q and W_o -> W_v^T at init (0: plain random init)
    # Heads that start attending a fixed number of tokens back (q/k biases; one tuple per layer
    # from layer 0, one offset per head): layer 0 moves a token's near neighbours into it, layer 1
    # reaches a sentence's subject 5-8 tokens before its value. Gradient descent then refines them.
    c.model.positional_heads = ((1, 2, 3, 4), (5, 6, 7, 8))
    c.model.positional_strength = 8.0
    c.model.remat = False
    c.model.train_query_block = 128  # attention by 128-query blocks against the keys up to each block's end
    # A name token's embedding = a vector shared by its type (person, city, company, country),
    # trained, + a fixed random code of its own, so a reserved name (never seen in pretraining)
    # looks exactly like the names the model learnt to copy. Attribute values the same way.
    c.model.tie_names = True
    c.model.tie_values = True
    c.model.recode_values_on_resume = False

    # Phase 1 (steps 0..first_phase.steps): short rows, binding from the start.
    c.first_phase = ml_collections.ConfigDict()
    c.first_phase.steps = 1500
    c.first_phase.max_len = 512
    c.first_phase.batch_size = 32
    c.first_phase.repeat = 0.2
    c.first_phase.recall = 0.1
    c.first_phase.cloze = 0.3
    c.first_phase.bind = 0.4
    c.first_phase.long_passages = (2, 6)
    c.first_phase.bind_entities = (2, 4)

    # Phase 2 (to train.steps): long contexts, multi-objective rows, agent episodes.
    c.curriculum = ml_collections.ConfigDict()
    c.curriculum.repeat = 0.1
    c.curriculum.recall = 0.05
    c.curriculum.cloze = 0.15
    c.curriculum.bind = 0.3
    c.curriculum.long = 0.2
    c.curriculum.multi = 0.05
    c.curriculum.demo = 0.15
    c.curriculum.name_copy = 0.25    # names seen earlier in a context row are targets at this weight
    c.curriculum.long_passages = (4, 16)
    c.curriculum.bind_entities = (2, 8)
    c.curriculum.demo_workflows = ("memsearcher", "react", "mem1", "memory_ops")
    c.curriculum.demo_objectives = (1, 2)
    c.curriculum.world_entities = 30
    c.curriculum.rows_per_world = 32
    c.curriculum.top_n = 2           # the agent's default_top_n in configs/default.py

    # Phase 3 (steps 4000..4300): mostly agent episodes, one objective, every workflow alike, at a
    # constant 3e-4. After phase 2 the base read well but the default job barely learnt (held-out
    # EM 5 -> 21): its agent wrote memory from one habitual sentence per kind of passage, whatever
    # the question.
    # Episodes were 15% of phase 2's rows split over 8 (workflow, objective count) kinds, ~2% per
    # kind; here they are ~86% of rows over 4 kinds (docs/experiments.md, 2026-11-26).
    c.third_phase = ml_collections.ConfigDict()
    c.third_phase.start = 4000
    c.third_phase.learning_rate = 3e-4
    c.third_phase.demo = 0.9
    c.third_phase.repeat = 0.0
    c.third_phase.recall = 0.0
    c.third_phase.cloze = 0.05
    c.third_phase.bind = 0.05
    c.third_phase.long = 0.05
    c.third_phase.multi = 0.0
    c.third_phase.demo_objectives = (1,)

    c.train = ml_collections.ConfigDict()
    c.train.steps = 4300
    c.train.batch_size = 16          # phase 2: 16 rows of up to 1024 tokens
    c.train.max_len = 1024
    c.train.pack = True              # rows packed several to a sequence (same loss, less padding)
    c.train.learning_rate = 1e-3
    c.train.warmup = 200
    c.train.decay_steps = 4000       # the cosine reaches its floor here (0: at train.steps); phase 3 sets its own
    c.train.final_lr_fraction = 0.1
    c.train.weight_decay = 0.01
    c.train.min_len = 128
    c.train.compilation_cache_dir = "~/.cache/memsearcher-jax/xla-cache"
    c.train.seed = 0
    c.train.output_dir = "runs/base_v2"
    c.train.export_dir = ""          # where the finished base is written ("": output_dir/base)
    c.train.save_every = 100
    c.train.keep_period = 0          # also keep every keep_period-th checkpoint (0: only the last two)
    c.train.probe_every = 250
    c.train.probe_items = 256        # per progress set (2, 8, 16 passages, multi)
    c.train.final_probe_items = 512  # per final set, measured once on the exported bf16 weights
    c.train.log_every = 10
    c.run_notes = ()
    return c
