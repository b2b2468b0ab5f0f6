"""Shared by the pod recipes (configs/recipe_qwen2_5_*_*.py; not a config itself): the MemSearcher recipe
(configs/memsearcher_qwen2_5_3b.py, B=256, G=5) on a given model and pod.

Each recipe file picks the mesh, micro-batch sizes and remat for its pod and says why;
`memsearcher-jax plan --config <recipe>` prints the per-device memory table behind the choice.
"""
import importlib.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))

# What the planner and the launchers read. HBM per chip: v4 32 GiB, v5e 16 GiB, v5p 95 GiB,
# H100 80 GiB. JAX sees one device per chip (v4 and v5p chips are megacores), so v4-32 is 16
# devices and v5p-128 is 64 devices.
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


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_recipe_{name[:-3]}", os.path.join(_HERE, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recipe(model: str, pod: str, data: int, fsdp: int, tp: int, micro_batch_size: int, logprob_batch_size: int):
    import ml_collections

    if model not in MODELS or pod not in PODS:
        raise ValueError(f"unknown model {model!r} or pod {pod!r}; models {sorted(MODELS)}, pods {sorted(PODS)}")
    c = _load("memsearcher_qwen2_5_3b.py").get_config()
    c.model.preset = model
    c.model.source = f"models/{MODELS[model]}"  # a local HF dir on every host (or a shared mount)
    c.model.param_dtype = "float32"  # f32 master weights: lr 1e-6 updates vanish in bf16
    c.model.dtype = "bfloat16"
    c.model.remat = True             # activations at 8K tokens dominate otherwise (see the plan)
    c.model.scan_layers = True
    # MemSearcher's per-call context stays under ~4K (docs/method.md §5): 8K slots cover act + up to
    # 10 passages + the memory update with room, and halve the cache of the 16K default.
    c.agent.max_context_tokens = 8192
    c.agent.max_response_tokens = 6144
    c.rl.micro_batch_size = micro_batch_size
    c.rl.logprob_batch_size = logprob_batch_size
    c.mesh.data, c.mesh.fsdp, c.mesh.tp = data, fsdp, tp
    c.train.output_dir = f"runs/{model}_{pod}"
    c.hardware = ml_collections.ConfigDict(dict(PODS[pod], usable_fraction=0.9))
    return c
