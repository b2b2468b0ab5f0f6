"""The embedded default: a tiny Qwen2-architecture agent on a synthetic multi-hop world.

Runs end to end on a 2-core CPU. It starts from the shipped reading base
(memsearcher_jax/bases/reading_v8, pretrained with configs/base_v8.py), builds a world whose
entities take names the base never saw (its reserved pool; cached), a BM25 index over the
world's passages, a short supervised warm start on a deliberately flawed demonstrator (it
answers without searching half of the time), then multi-context GRPO, and reports
held-out EM before and after GRPO with the learning curve.

    memsearcher-jax train --config configs/default.py [--config.train.steps=40 ...]
"""
import ml_collections

from memsearcher_jax.bases import DEFAULT_BASE


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()

    c.model = ml_collections.ConfigDict()
    c.model.source = DEFAULT_BASE    # a HF model dir (the shipped reading base), or "init": random weights
    c.model.preset = "tiny"          # preset and sizes below: only for source="init"
    c.model.hidden_size = 128
    c.model.intermediate_size = 256
    c.model.num_layers = 4
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.head_dim = 32
    c.model.rope_theta = 10000.0
    c.model.dtype = "float32"
    c.model.param_dtype = "float32"
    c.model.scan_layers = False
    c.model.remat = False
    c.model.init_seed = 0
    c.model.lora_rank = 0            # 0: full fine-tuning; r > 0: train rank-r LoRA adapters over a frozen base
    c.model.lora_alpha = 16.0        # the adapters' scale is lora_alpha / lora_rank
    c.model.lora_targets = ("q", "k", "v", "o", "gate", "up", "down")  # projections that get adapters

    c.world = ml_collections.ConfigDict()
    c.world.enabled = True           # the synthetic world supplies data, corpus and tokenizer
    c.world.seed = 0
    c.world.num_entities = 100
    c.world.whole_name_tokens = False  # let BPE merge names into single tokens (default: syllable pieces)
    c.world.heldout_by = "entity"    # "entity": held-out names never asked about in training; "fact": held-out facts
    c.world.cache_dir = "~/.cache/memsearcher-jax/worlds"
    c.world.objectives = 1           # questions asked at once, joined "q1; q2" (MEM1's task; answer "a1; a2")
    # GRPO's training questions at several counts in equal shares ("1,2,3,4"); "": world.objectives
    # only. Evaluation asks world.objectives (or eval --objectives).
    c.world.objectives_mix = ""
    c.world.objectives_schedule = ""  # GRPO's counts by step instead: "0:1,2;20:2,4;40:4,8" ("": off; rl/schedule.py)
    c.world.schedule_advance_em = 0.0  # > 0: a stage also ends once its last schedule_window steps' mean EM reaches it
    c.world.schedule_window = 5

    c.data = ml_collections.ConfigDict()
    c.data.train_path = ""           # for real data: a FlashRAG jsonl / Search-R1 parquet file or dir
    c.data.eval_path = ""
    c.data.tokenizer_dir = ""        # defaults to the model dir (or the world's tokenizer)

    c.retrieval = ml_collections.ConfigDict()
    c.retrieval.kind = "bm25"        # "bm25" | "index" (a saved index dir) | "http"
    c.retrieval.index_dir = ""
    c.retrieval.url = ""
    c.retrieval.api = "memsearcher"  # for http: "memsearcher" or "search-r1"

    c.agent = ml_collections.ConfigDict()
    c.agent.workflow = "memsearcher"
    c.agent.max_turns = 4
    c.agent.max_new_tokens = 64
    c.agent.memory_budget = 64
    c.agent.max_response_tokens = 512
    c.agent.max_context_tokens = 1024
    c.agent.default_top_n = 2
    c.agent.max_top_n = 5
    # Tokens one observation adds to its row, markup included (0: max_response_tokens); documents are cut to fit
    # and a cut says so. Here no observation is ever cut: the largest one this job can make is 971 tokens (3
    # searches x max_top_n=5 passages of at most 52 tokens, with memory_ops' instruction; 928 for memsearcher).
    c.agent.max_observation_tokens = 1024
    # Searches one act may run; its further calls get one refusal note instead. None is ever refused here: an
    # executable call takes at least 19 tokens of this tokenizer, so a 64-token act holds at most 3.
    c.agent.max_searches_per_act = 3
    c.agent.missing_top_n = 0        # passages for a call without top_n (0: default_top_n)
    c.agent.temperature = 1.0       # training rollouts; the learner scores tokens at this temperature too
    c.agent.top_p = 1.0
    c.agent.top_k = 0
    c.agent.eval_max_turns = 6
    c.agent.turns_per_question = 0   # turns each question after the first adds to max_turns and eval_max_turns (0: off)
    c.agent.hint = "none"            # "turns" | "turns_and_questions": MEM1's hint line ending each act's user message
    c.agent.summary_budget = 256     # summary: history tokens (acts, observations) of a segment before its summary act
    c.agent.summary_overlong_mask = "none"  # summary: "segment" | "trajectory": SUPO, no loss on what a limit cut
    c.agent.fold_turns = 4           # fold: acts one branch may take (its last returns or answers)
    c.agent.prompt_style = "compact"  # few-token system prompt; the recipe uses "full"
    c.agent.tool = "wikipedia_search"  # the search tool by registered name (memsearcher_jax/agent/tools.py)
    c.agent.multi_answer_prompt = "auto"  # state the N-answer format ("a1; a2") in every system prompt: auto
                                     # where the task asks several questions (world or demo objectives > 1)
    c.agent.tool_schema = ""         # or a JSON function schema of your own: {"name", "description", "parameters"}
    c.agent.stop_token_ids = ()      # ids a generation ends on besides <|im_end|> (empty: the tokenizer's
                                     # eos and the model dir's generation_config eos_token_id list)

    c.sampler = ml_collections.ConfigDict()
    c.sampler.cache_dtype = "float32"
    c.sampler.batch_size = 0         # rows per sampler call (0: every live row in one call)
    c.sampler.prefill_query_block = 512  # prefill attention: queries per block (0: all at once)

    c.sft = ml_collections.ConfigDict()
    c.sft.passes = 0.0               # > 0: the warm start's length in passes over its rows instead of sft.steps
    c.sft.steps = 150                # supervised warm start before GRPO (0: none); the base already reads
    c.sft.batch_size = 16
    c.sft.learning_rate = 1e-3
    c.sft.warmup = 20
    c.sft.min_len = 128              # rows pad to quarter-octave buckets from here (sampling.buckets.bucket)
    # A batch padded past this many slots (rows x bucket length) takes its update over micro-batches
    # of at most this many, gradients summed (the same update up to rounding): long ReAct rows
    # (~1400 tokens x 16) peaked at 15.5 GB in one program. 0: one program per batch, as before.
    c.sft.max_batch_tokens = 0
    c.sft.num_demos = 600
    # Name and value embedding rows move together per type in SFT, as in pretraining (the reading base's
    # names are a shared vector per type + a fixed code each). "auto": where the model has a reading
    # vocabulary (the shipped bases), True / False to force. Untied, the warm start moves the training
    # entities' rows alone and the agent searches for a training name on 26% of seed 0's held-out
    # questions; tied, the learning bench's mean gain is 77.7 against 63.0 (docs/lab/2026-11-29-reading-v8-ships.md).
    c.sft.tie_embedding_rows = "auto"
    # Share of demonstrations whose entity names are swapped (consistently, per demonstration) for
    # reading-vocabulary names the world never uses, so SFT teaches copying a name rather than writing
    # a training one (data/name_swap.py; needs a reading vocabulary). 0: the demonstrations as scripted.
    c.sft.name_swap_rate = 0.0
    # The demonstrator's deliberate flaws (share of demos; at most one flaw per demo).
    # Answering early is the demonstrator's habit (half of its demos), so the warm-started policy
    # mostly answers without searching: a mistake SFT copies and only reward can correct. At 0.6 the
    # warm start from reading_v7 sampled a search on 5% of seed 2's trajectories and GRPO gained +5;
    # at 0.5 it gained +53 (docs/lab/2026-11-29-demonstrator-at-half-reading-v7-ships.md).
    c.sft.vague_query_rate = 0.1     # a vague or wrong-entity first search, then a recovery search
    c.sft.wrong_answer_rate = 0.05   # every hop searched, the boxed answer wrong
    c.sft.early_answer_rate = 0.5    # answers before every hop is found (here: before any search)
    c.sft.two_hop_early_rate = 0.0   # share of 2-hop demos that stop after hop 1 (drawn apart from the above)
    # How an early 2-hop answer stops: "no_search" guesses before any search, as on 1-hop questions, so
    # every demo that searches a 2-hop question finishes both hops; "first_hop" stops after the first
    # hop and boxes the bridge entity (the warm-started policy then almost never tries a second
    # search, and whether GRPO finds it within 30 steps varies by seed:
    # docs/lab/2026-11-26-why-seed-2-learns-slowly.md).
    c.sft.early_two_hop = "no_search"
    # With several objectives (bench/paper_tables.py): "first_hop" stops one 2-hop objective after its
    # first hop and boxes the bridge; "skip" leaves one objective unsearched and guesses its answer.
    c.sft.early_several = "first_hop"
    c.sft.react_share = 0.0          # share of demos recorded in the ReAct format (bench/context.py uses 0.5)
    # What a search that found nothing leaves in memory ({s}: the subject). bench/paper_tables.py uses
    # "{s}: no result." (a fact's shape); here the wording the base was pretrained on gains more
    # (docs/lab/2026-11-30-default-job-after-the-no-result-note.md).
    c.sft.no_result_note = "Nothing found about {s} yet."
    # Objective counts of the demonstrations, equal shares (e.g. "1,2": half single questions, half
    # pairs); "": world.objectives only. bench/paper_tables.py uses "1,<training count>": a base that
    # has only seen pairs answers every question with two answers (an instruct LLM already knows one).
    c.sft.demo_objectives = ""

    c.rl = ml_collections.ConfigDict()
    c.rl.batch_questions = 16        # B
    c.rl.group_size = 5              # G
    c.rl.optimizer_steps = 2         # optimizer steps per training step (fixed)
    c.rl.micro_batch_size = 16
    c.rl.logprob_batch_size = 32
    c.rl.shuffle_rows = True
    c.rl.aggregation = "token_mean"  # | "trajectory_mean" | "trajectory_row_mean" | "microbatch_token_mean"
    c.rl.clip_low = 0.2
    c.rl.clip_high = 0.2
    c.rl.dual_clip = 3.0
    c.rl.kl_coef = 0.001
    c.rl.kl_estimator = "low_var_kl"  # k3 (docs/method.md §2); "k1" and "k2" also registered
    c.rl.kl_clamp = 10.0
    c.rl.log_ratio_clamp = 20.0
    c.rl.entropy_coef = 0.001
    c.rl.filter_groups = "none"      # "zero_std": drop groups whose rewards all tie and refill from new questions
    c.rl.max_refill = 2              # refill rounds per step for zero_std
    c.rl.reward_fn = ""              # "module:function" or "file.py:function" with qa_metrics.compute_reward's
                                     # signature; "" = the MemSearcher reward (docs/method.md §3)
    c.rl.logits_chunk = 0            # loss logits this many positions at a time, recomputed in backward (0: all)
    c.rl.tis_cap = 0.0               # truncated importance sampling: weight = min(exp(trainer - sampler logp), cap);
                                     # 0 off
    c.rl.min_seq_len = 128           # the trainer's rows pad to quarter-octave buckets from here
    c.rl.max_seq_len = 32768         # a conversation longer than this stops the step with an error
    c.rl.pack_rows = True            # the learner packs conversations into shared rows (segments): exact, less padding
    c.rl.old_logprobs = "sampler"    # the old policy's log-probs are the rollout's own (the sampler runs the trainer's
                                     # f32 weights: gaps <= 6e-5 here), recomputed in a step whose gap exceeds the next
                                     # setting; "recompute": one more forward pass over every row (verl's default)
    c.rl.old_logprobs_max_gap = 0.01  # "sampler": largest |trainer - sampler| log-prob of a sampled token accepted
                                      # (a ratio off by 1%, a twentieth of the 0.2 clip range)
    # Per-question information signal (rl/information.py): "log" scores log p(gold answer | the context each turn
    # carries) for every question after the rollout (info/* metrics); "reward" also adds info_coef x its
    # group-normalised gain on right answers to the advantage (0: bit-identical to "off"). "off": not computed.
    c.rl.info_signal = "off"
    c.rl.info_coef = 0.0

    c.optim = ml_collections.ConfigDict()
    c.optim.learning_rate = 1e-4     # the recipe's 1e-6 is for a pretrained 3B model
    c.optim.b1 = 0.9
    c.optim.b2 = 0.999
    c.optim.weight_decay = 0.01
    c.optim.max_grad_norm = 1.0
    c.optim.schedule = "constant"    # "constant" (the recipe) | "cosine" (to final_lr_fraction at the last
                                     # optimizer step)
    c.optim.warmup_steps = 0         # linear warm-up over this many optimizer steps
    c.optim.final_lr_fraction = 0.1  # cosine: the learning rate at the last step, as a fraction of the peak

    c.train = ml_collections.ConfigDict()
    # The base (4 x 256, reading_v3's size and now reading_v8's) is twice as wide as reading_v2 (~3x the
    # CPU time per GRPO step) and learns faster per step: 8 steps instead of reading_v2's 30 kept the
    # job as fast (docs/lab/2026-11-26-reading-v3-on-a-lent-h200.md). The warm start keeps its 150 steps:
    # after 60 one seed's policy never sampled a search, and GRPO had nothing to reinforce. From
    # reading_v7, 10 steps: seed 2 was still climbing at step 8 (training EM 85%, held-out 71%), and the
    # job stays within +25% of reading_tiny's (+4.3% from reading_v7, +10.3% from reading_v8 in a later
    # run of the same bench; docs/lab/2026-11-29-reading-v8-ships.md).
    c.train.steps = 10
    c.train.seed = 0
    c.train.output_dir = "runs/default"
    c.train.save_every = 10
    c.train.keep = 3
    c.train.eval_questions = 100     # held-out questions scored before and after GRPO (0: skip)
    c.train.eval_per_set = 0         # instead: the first N of every evaluation set (real data, 7 benchmarks)
    c.train.eval_every = 0           # steps between held-out evaluations during GRPO (eval/em ...; 0: none);
                                     # the best params by eval/em are kept in OUTPUT/best/ (export-hf --best)
    c.train.log_samples_every = 0    # steps between sample trajectories logged as text (0: none)
    c.train.samples_per_log = 4      # trajectories in each of those logs
    c.train.wandb_project = ""       # also log to Weights & Biases ("" : off; WANDB_MODE=offline works)
    c.train.compilation_cache_dir = "~/.cache/memsearcher-jax/xla-cache"  # JAX's persistent compilation cache
                                     # ("" : off; $MEMSEARCHER_JAX_COMPILATION_CACHE overrides): reruns skip compiling

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1
    c.mesh.fsdp = 1
    c.mesh.tp = 1
    return c
