"""The MemSearcher recipe: Qwen2.5-3B-Instruct, B=256, G=5, 5 turns, 512 tokens per call,
memory 1024, temperature 1.0, top-p 0.99, lr 1e-6, 2 optimizer steps of 128 questions each.

Needs accelerators (see docs/scale_out.md); it cannot run on a CPU.
    memsearcher-jax train --config configs/memsearcher_qwen2_5_3b.py \
        --config.model.source=/path/to/Qwen2.5-3B-Instruct --config.data.train_path=/data/nq_hotpotqa_train \
        --config.retrieval.kind=http --config.retrieval.url=http://127.0.0.1:8000
"""
import importlib.util
import os

# configs/default.py, loaded by its path: no sys.path entry and no module named "default" left
# behind (configs/recipe.py runs this file from inside its get_config, after the loader is done).
_spec = importlib.util.spec_from_file_location("_memsearcher_default_config",
                                               os.path.join(os.path.dirname(os.path.abspath(__file__)), "default.py"))
default = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(default)


def get_config():
    c = default.get_config()
    c.model.source = "Qwen2.5-3B-Instruct"  # a local Hugging Face directory
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.scan_layers = True
    c.model.remat = True
    c.world.enabled = False
    c.data.train_path = "data/nq_hotpotqa_train"
    c.data.eval_path = "data"
    c.retrieval.kind = "http"
    c.retrieval.url = "http://127.0.0.1:8000"
    c.agent.max_turns = 5
    c.agent.eval_max_turns = 20
    c.agent.max_new_tokens = 512
    c.agent.memory_budget = 1024
    c.agent.max_response_tokens = 8192
    c.agent.max_context_tokens = 16384
    c.agent.default_top_n = 5
    c.agent.max_top_n = 10
    c.agent.missing_top_n = 10  # the recipe's server default when a call gives no top_n
    c.agent.max_searches_per_act = 3  # searches an act may run (3 x 10 passages, ~4,500 tokens); the rest are refused
    # An observation gets what a conversation leaves after the planner's prompt (512 + the memory), the act and
    # the memory update, so the longest training row stays min(context, prompt + response) (7,168 here).
    c.agent.max_observation_tokens = (min(c.agent.max_response_tokens,
                                          c.agent.max_context_tokens - 512 - c.agent.memory_budget)
                                      - 2 * c.agent.max_new_tokens)
    c.agent.temperature = 1.0
    c.agent.top_p = 0.99
    c.agent.prompt_style = "full"
    c.sampler.cache_dtype = "bfloat16"
    # bf16 sampling against the trainer's bf16 compute of f32 weights differs by ~0.03 nats on some
    # tokens (docs/lab/2026-11-29-first-step-kl.md), above rl.old_logprobs_max_gap: taking the sampler's
    # log-probs would fall back to recomputing them every step. Recompute, as verl does.
    c.rl.old_logprobs = "recompute"
    c.sft.steps = 0
    c.rl.batch_questions = 256
    c.rl.group_size = 5
    c.rl.optimizer_steps = 2
    c.rl.micro_batch_size = 8
    c.rl.logprob_batch_size = 32
    c.rl.min_seq_len = 1024
    c.optim.learning_rate = 1e-6
    c.train.steps = 1000
    c.train.output_dir = "runs/memsearcher_qwen2_5_3b"
    c.train.save_every = 20
    c.train.keep = 3
    c.train.eval_questions = 0
    c.train.eval_every = 50          # the 7 benchmarks under data.eval_path, every 50 steps; best kept
    c.train.eval_per_set = 200       # the first 200 questions of each (Search-R1's evaluation limit)
    c.mesh.data = 1
    c.mesh.fsdp = 4
    c.mesh.tp = 2
    return c
