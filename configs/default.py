"""The embedded default: a tiny Qwen2-architecture agent on a synthetic multi-hop world.

Runs end to end on a 2-core CPU. It starts from the shipped reading base
(memsearcher_jax/bases/reading_v8, pretrained with configs/base_v8.py), builds a world whose
entities take names the base never saw (its reserved pool; cached), a BM25 index over the
world's passages, a short supervised warm start on a deliberately flawed demonstrator (it
answers without searching half of the time), then multi-context GRPO, and reports
held-out EM before and after GRPO with the learning curve.

    memsearcher-jax train --config configs/default.py [--config.train.steps=40 ...]

Every key starts at its default (the paper recipe's; docs/config.md lists them all) and the job
sets only where a 2-core CPU run differs, each with its reason.
"""
import ml_collections

from memsearcher_jax.settings import Settings


def get_config() -> ml_collections.ConfigDict:
    c = Settings().to_config()

    # f32 compute, layer by layer: the base is 4 x 256, so neither scanning nor remat pays off on a CPU.
    c.model.dtype = "float32"
    c.model.scan_layers = False
    c.model.remat = False

    # The synthetic world's short questions and passages at a 2-core CPU's budget.
    c.agent.max_turns = 4
    c.agent.eval_max_turns = 6
    c.agent.max_new_tokens = 64
    c.agent.memory_budget = 64
    c.agent.max_response_tokens = 512
    c.agent.max_context_tokens = 1024
    c.agent.default_top_n = 2
    c.agent.max_top_n = 5
    c.agent.missing_top_n = 0         # a call without top_n gets default_top_n, what the prompt says
    c.agent.max_observation_tokens = 1024  # none is cut: the largest observation this job makes is 971 tokens
    c.agent.top_p = 1.0               # a tiny model: plain sampling
    c.agent.prompt_style = "compact"  # a few-token system prompt for a tiny model

    c.sampler.cache_dtype = "float32"  # the trainer's dtype, so the sampler's log-probs are its own
    c.rl.old_logprobs = "sampler"     # f32 sampling: gaps <= 6e-5 here, no extra pass (docs/benchmarks.md)

    # The base reads but has never acted: 150 warm-start steps, else GRPO never sees a search to reinforce
    # (docs/lab/2026-11-26-reading-v3-on-a-lent-h200.md).
    c.sft.steps = 150

    c.rl.batch_questions = 16         # a CPU step's worth of questions
    c.rl.micro_batch_size = 16
    c.rl.min_seq_len = 128            # a tiny run's rows are short
    c.optim.learning_rate = 1e-4      # the recipe's 1e-6 is for a pretrained 3B model

    # 10 steps: seed 2 is still climbing at step 8 (docs/lab/2026-11-29-reading-v8-ships.md).
    c.train.steps = 10
    c.train.save_every = 10
    c.train.eval_questions = 100      # held-out questions of the world, scored before and after GRPO
    c.train.eval_per_set = 0
    c.train.eval_every = 0            # only before and after: a CPU step is minutes
    return c
