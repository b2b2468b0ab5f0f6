"""The MemSearcher recipe (configs/memsearcher_qwen2_5_3b.py: B=256, G=5) on a given model and pod,
chosen with the ml-collections config string `MODEL,POD`:

    memsearcher-jax plan --config configs/recipe.py:qwen2_5_3b,v5e_64

Models: qwen2_5_3b, qwen2_5_7b, qwen2_5_14b. Pods: v4_32, v5e_64, v5p_128, h100_8.
RECIPES below gives each pair's mesh, micro-batch sizes and rows per sampler call, with the reason;
`memsearcher-jax plan --config configs/recipe.py:MODEL,POD` prints the per-device memory table
behind it (and exits non-zero when it does not fit). Percentages are of usable memory (90% of the
chip). Every pair fits: where full fine-tuning cannot (7B on v5e-64, 14B on v4-32 and v5e-64),
the recipe trains LoRA adapters instead, and says so in its `why`.
"""
from __future__ import annotations

import importlib.util
import os
from typing import NamedTuple

_HERE = os.path.dirname(os.path.abspath(__file__))

# What the planner and the launchers read. HBM per chip: v4 32 GiB, v5e 16 GiB, v5p 95 GiB,
# H100 80 GiB. JAX sees one device per chip (v4 and v5p chips are megacores), so v4-32 is 16
# devices and v5p-128 is 64 devices. Every TPU host has 4 chips, and global_mesh keeps tensor
# parallelism inside a host, so tp is at most 4 on the pods.
PODS = {
    "v4_32": dict(device_kind="TPU v4", num_devices=16, device_memory_gib=32.0, hosts=4,
                  accelerator_type="v4-32", runtime_version="tpu-ubuntu2204-base"),
    "v5e_64": dict(device_kind="TPU v5 lite", num_devices=64, device_memory_gib=16.0, hosts=16,
                   accelerator_type="v5litepod-64", runtime_version="v2-alpha-tpuv5-lite"),
    "v5p_128": dict(device_kind="TPU v5p", num_devices=64, device_memory_gib=95.0, hosts=16,
                    accelerator_type="v5p-128", runtime_version="v2-alpha-tpuv5"),
    "h100_8": dict(device_kind="NVIDIA H100 80GB", num_devices=8, device_memory_gib=80.0, hosts=1,
                   nodes=1, gpus_per_node=8),
}
MODELS = {"qwen2_5_3b": "Qwen2.5-3B-Instruct", "qwen2_5_7b": "Qwen2.5-7B-Instruct",
          "qwen2_5_14b": "Qwen2.5-14B-Instruct"}


class Recipe(NamedTuple):
    mesh: tuple[int, int, int]  # (data, fsdp, tp)
    micro_batch_size: int       # rl.micro_batch_size and rl.logprob_batch_size: one row per (data x fsdp)
    logprob_batch_size: int     # shard, since an 8K-token row is the activation unit
    sampler_batch_size: int     # rows per sampler call; a power of two (the sampler's own bucket)
    why: str
    lora_rank: int = 0          # > 0: LoRA where full fine-tuning cannot fit (see LORA below)
    logits_chunk: int = 0       # rl.logits_chunk: the loss's logits this many positions at a time (0: all)
    context: int = 8192         # agent.max_context_tokens: a training row's longest conversation


# Where full fine-tuning cannot fit, the recipe trains LoRA adapters instead: rank 32 (alpha 64)
# on every projection over a frozen bf16 base, which is also the KL reference (no copy). The
# learning rate goes from the recipe's 1e-6 to 1e-5, LoRA's usual ~10x of full fine-tuning's.
LORA = dict(lora_alpha=64.0, param_dtype="bfloat16", learning_rate=1e-5)


# Rollout rows per call: the largest power of two that keeps the rollout below the update's peak, or
# the total at or under ~80% of usable when the rollout is the peak (the prefill row's estimate error).
# "Host-local 1x1x4": on a pod each host samples its own B*G/hosts rows on its own chips; with tp=4 the
# 2 KV heads of the 3B do not split, so every chip holds a call's whole cache. Prefill: grid K/V, mask,
# 512-query attention blocks.
R = Recipe
RECIPES = {
    # Qwen2.5-3B (2 KV heads)
    ("qwen2_5_3b", "v4_32"): R((1, 4, 4), 4, 4, 16,
        "tp=4 (a host's chips) splits the f32 logits 4 ways, fsdp=4 the weights; ~66%, peak rollout. Each host "
        "samples 320 rows on its 4 chips (1x1x4): ~0.30 GiB cache + ~0.6 GiB prefill per row; 32 rows need ~116%."),
    ("qwen2_5_3b", "v5e_64"): R((1, 16, 4), 16, 16, 8,
        "the tightest pod: tp=4 cuts the sampler's TP-only copy and the logits 4 ways, fsdp=16 the weights and "
        "batch; ~85%, peak update. Host-local 1x1x4: ~0.31 GiB cache + ~0.6 GiB prefill per row; 16 rows need ~117%."),
    ("qwen2_5_3b", "v5p_128"): R((1, 32, 2), 32, 32, 128,
        "memory is plentiful: tp=2 (the 2 KV heads), fsdp=32 for the most data parallelism; ~61%, peak rollout. "
        "Host-local 1x2x2: ~0.18 GiB cache + ~0.6 GiB prefill per row, so a host's 80 rows go in one call."),
    ("qwen2_5_3b", "h100_8"): R((1, 4, 2), 4, 4, 256,
        "one NVLink node: tp=2 matches the 2 KV heads so the cache splits 8 ways, fsdp=4; ~76%, peak rollout. "
        "~0.15 GiB cache + ~0.6 GiB prefill per row per GPU: 256 rows per call, 5 calls per generation phase."),
    # Qwen2.5-7B (4 KV heads, 28 heads)
    ("qwen2_5_7b", "v4_32"): R((1, 4, 4), 4, 4, 16,
        "fits with no slack (~99%, peak update): f32 weights, reference, moments and the bf16 sampler copy are "
        "~10.6 GiB/chip before the update's ~18 GiB; watch step 1 (a bf16 reference or v4-64 gives room). "
        "Host-local 1x1x4: ~0.12 GiB cache + ~0.55 GiB prefill per row: 16 rows per call; 32 make the rollout "
        "the peak at ~111%."),
    ("qwen2_5_7b", "v5e_64"): R((1, 16, 4), 16, 16, 8,
        "LoRA: full fine-tuning does not fit (~1.3x even at one row per call: the bf16 sampler copy, ~3.5 GiB "
        "at tp=4, + f32 state, then the update's ~14 GiB at 8K tokens). Rank-32 adapters over a frozen bf16 base "
        "(no reference copy, optimizer state for the adapters alone) and the loss logits in 1024-position chunks: "
        "~88%, peak update. Host-local 1x1x4: 8 rows per call; 16 make the rollout the peak at ~102%.",
        lora_rank=32, logits_chunk=1024),
    ("qwen2_5_7b", "v5p_128"): R((1, 16, 4), 16, 16, 64,
        "tp=4 (4 KV heads; a host's chips), fsdp=16; ~56%, peak rollout. Host-local 1x1x4: ~0.12 GiB cache + "
        "~0.55 GiB prefill per row: 64 rows per call (2 calls per generation phase); 128 need ~106%."),
    ("qwen2_5_7b", "h100_8"): R((1, 2, 4), 2, 2, 64,
        "tp=4 within NVLink (4 KV heads), fsdp=2; ~57%, peak update. ~0.12 GiB cache + ~0.55 GiB prefill per row "
        "per GPU: 64 rows per call; 128 plan at ~84%, over the ~80% the prefill estimate's error allows."),
    # Qwen2.5-14B (8 KV heads, 40 heads)
    ("qwen2_5_14b", "v4_32"): R((1, 4, 4), 4, 4, 8,
        "LoRA: full fine-tuning does not fit (~1.7x: tp capped at 4, ~14 GiB/chip of f32 weights, reference "
        "and moments next to the ~7 GiB bf16 sampler copy, before the update's ~27 GiB). Rank-32 adapters over "
        "a frozen bf16 base (~1.7 GiB/chip), loss logits in 1024-position chunks: ~78%, peak update. "
        "Host-local 1x1x4: ~0.40 GiB cache + ~0.9 GiB prefill per row: 8 rows per call; 16 need ~104%.",
        lora_rank=32, logits_chunk=1024),
    ("qwen2_5_14b", "v5e_64"): R((1, 16, 4), 16, 16, 4,
        "LoRA and 4K-token conversations: even LoRA does not fit 8K rows on 16 GiB chips (the bf16 sampler copy "
        "alone is ~6.9 GiB/chip at tp=4, a host's most, and remat still keeps 48 layer inputs of an 8K row). "
        "Rank-32 adapters over a frozen bf16 base, loss logits in 1024-position chunks, "
        "agent.max_context_tokens=4096 (MemSearcher's contexts mostly stay under 4K, docs/method.md §5; longer "
        "conversations end at the cap): ~89%, peak update. Host-local 1x1x4: 4 rows per call; 8 make the "
        "rollout the peak at ~90%.",
        lora_rank=32, logits_chunk=1024, context=4096),
    ("qwen2_5_14b", "v5p_128"): R((1, 16, 4), 16, 16, 32,
        "tp=4, a host's most (40 heads and 8 KV heads divide by 4), fsdp=16; ~61%, peak rollout. Host-local "
        "1x1x4: ~0.40 GiB cache + ~0.9 GiB prefill per row: 32 rows per call (3 per phase); 64 need ~110%."),
    ("qwen2_5_14b", "h100_8"): R((1, 1, 8), 1, 1, 32,
        "tp=8 (8 KV heads): f32 weights + reference + moments ~28 GiB/GPU, sampler copy ~3.4 GiB; ~87%, peak "
        "update. fsdp=1: every GPU holds every row, ~0.20 GiB cache + ~0.5 GiB prefill: 32 rows; 64 need ~108%."),
}
del R


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_recipe_{name[:-3]}", os.path.join(_HERE, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _choices() -> str:
    return (f"models {sorted(MODELS)}, pods {sorted(PODS)} "
            "(e.g. --config configs/recipe.py:qwen2_5_3b,v5e_64)")


def get_config(config_string: str | None = None):
    import ml_collections

    if not config_string:
        raise ValueError(f"configs/recipe.py needs MODEL,POD after a ':'; {_choices()}")
    parts = [s.strip() for s in config_string.split(",")]
    if len(parts) != 2:
        raise ValueError(f"expected MODEL,POD, got {config_string!r}; {_choices()}")
    model, pod = parts
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; {_choices()}")
    if pod not in PODS:
        raise ValueError(f"unknown pod {pod!r}; {_choices()}")
    if (model, pod) not in RECIPES:
        raise ValueError(f"no recipe for {model} on {pod}; {_choices()}")
    r = RECIPES[(model, pod)]

    c = _load("memsearcher_qwen2_5_3b.py").get_config()
    c.model.preset = model
    c.model.source = f"models/{MODELS[model]}"  # a local HF dir on every host (or a shared mount)
    c.model.param_dtype = "float32"  # f32 master weights: lr 1e-6 updates vanish in bf16
    c.model.dtype = "bfloat16"
    c.model.remat = True             # activations at 8K tokens dominate otherwise (see the plan)
    c.model.scan_layers = True
    # MemSearcher's per-call context stays under ~4K (docs/method.md §5): 8K slots cover act + up to
    # 10 passages + the memory update with room, and halve the cache of the 16K default.
    c.agent.max_context_tokens = r.context
    c.agent.max_response_tokens = 6144
    # What a conversation leaves an observation after the prompt, act and update (as in
    # memsearcher_qwen2_5_3b.py): 5,120 tokens at 8K, 1,536 at 4K, so the rows planned stay as they were.
    c.agent.max_observation_tokens = (min(c.agent.max_response_tokens,
                                          c.agent.max_context_tokens - 512 - c.agent.memory_budget)
                                      - 2 * c.agent.max_new_tokens)
    c.rl.micro_batch_size = r.micro_batch_size
    c.rl.logprob_batch_size = r.logprob_batch_size
    c.rl.logits_chunk = r.logits_chunk
    if r.lora_rank:
        c.model.lora_rank = r.lora_rank
        c.model.lora_alpha = LORA["lora_alpha"]
        c.model.param_dtype = LORA["param_dtype"]  # the frozen base: the bf16 matmuls read it as it is
        c.optim.learning_rate = LORA["learning_rate"]
    c.mesh.data, c.mesh.fsdp, c.mesh.tp = r.mesh
    c.sampler.batch_size = r.sampler_batch_size
    c.train.output_dir = f"runs/{model}_{pod}"
    c.hardware = ml_collections.ConfigDict(dict(PODS[pod], usable_fraction=0.9))
    return c
