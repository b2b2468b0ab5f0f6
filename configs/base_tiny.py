"""The reading base model: a tiny Qwen2-architecture model pretrained to read and copy.

    memsearcher-jax pretrain --config configs/base_tiny.py [--config.train.steps=...]

Builds the reading vocabulary (every name and value one token; names in pretrain / reserved
pools), then trains on the reading curriculum (`memsearcher_jax/data/curriculum.py`) over fresh
random worlds drawn from the pretrain names only, and exports a Hugging Face directory (bf16
safetensors, tokenizer, vocabulary manifest, base manifest with the probe's accuracy). The
shipped base, `memsearcher_jax/bases/reading_tiny`, was made by this file with its defaults.
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()

    c.vocab = ml_collections.ConfigDict()
    c.vocab.seed = 0                 # names of the pools (pretrain / reserved) come from this seed
    c.vocab.bpe_size = 640           # BPE entries besides names, values and agent tags

    c.model = ml_collections.ConfigDict()
    c.model.hidden_size = 128
    c.model.intermediate_size = 384
    c.model.num_layers = 4
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.head_dim = 32
    c.model.rope_theta = 10000.0
    c.model.init_seed = 0
    # A name token's embedding = a vector shared by its type (person, city, company, country),
    # trained, + a fixed random code of its own: the rows of one type share every update. A
    # reserved name, never seen in pretraining, so looks exactly like the names the model
    # learnt to copy (same type vector, a code from the same distribution).
    c.model.tie_names = True
    # The attribute values (years, occupations, colours, products, landmarks) the same way: a
    # vector per kind + a fixed code each. Trained one by one, their embeddings filled up with
    # priors and the copy circuit learnt on names did not reach them (years: 5% with one
    # passage shown, at step 1500 of the shipped run, which then switched: docs/experiments.md).
    c.model.tie_values = True
    c.model.recode_values_on_resume = False  # the one-off switch of that run

    c.curriculum = ml_collections.ConfigDict()
    c.curriculum.repeat = 0.3        # mix weights of the row kinds (data/curriculum.py)
    c.curriculum.recall = 0.2
    c.curriculum.cloze = 0.3
    c.curriculum.demo = 0.2
    c.curriculum.world_entities = 30
    c.curriculum.rows_per_world = 32
    c.curriculum.top_n = 2           # the agent's default_top_n in configs/default.py

    c.train = ml_collections.ConfigDict()
    c.train.steps = 3000
    c.train.batch_size = 64
    c.train.learning_rate = 1e-3
    c.train.warmup = 200
    c.train.final_lr_fraction = 0.1
    c.train.weight_decay = 0.01
    c.train.min_len = 128            # rows pad to quarter-octave buckets from here
    c.train.pack = False             # True: several rows per sequence, segment-masked (same loss, less padding)
    c.train.max_len = 512            # longer curriculum rows are dropped
    c.train.compilation_cache_dir = "~/.cache/memsearcher-jax/xla-cache"  # JAX's persistent compilation cache
                                     # ("": off): a resumed run loads its step programs instead of compiling
    c.train.seed = 0
    c.train.output_dir = "runs/base_tiny"
    c.train.save_every = 100
    c.train.probe_every = 100
    c.train.probe_items = 512
    c.train.export_dir = ""          # where the finished base is written ("" : output_dir/base)
    return c
