"""What a run is made of: the model, the synthetic world or your data, the retriever, and the
devices (the mesh, and a pod's optional hardware section). Defaults: the paper recipe's
(configs/memsearcher_qwen2_5_3b.py), but for what names a machine or a path."""
from __future__ import annotations

import dataclasses

from memsearcher_jax.bases import DEFAULT_BASE
from memsearcher_jax.data.synthetic import check_objectives
from memsearcher_jax.settings.fields import Section, setting

ALL_LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class ModelSettings(Section):
    """The policy: where its weights come from (or a random model's shape), its dtypes, the memory savers and LoRA."""
    key = "model"
    source: str = setting(DEFAULT_BASE, 'a local Hugging Face model directory (default: the shipped reading base), '
                                        'or "init" for random weights')
    preset: str = setting("tiny", 'a ModelConfig preset (qwen2_5_*, qwen3_*; models/config.py): the architecture '
                                  'for source="init", and the planner\'s shapes for a model not downloaded yet')
    hidden_size: int = setting(128, 'source="init": the hidden width')
    intermediate_size: int = setting(256, 'source="init": the MLP width')
    num_layers: int = setting(4, 'source="init": decoder layers')
    num_heads: int = setting(4, 'source="init": query heads')
    num_kv_heads: int = setting(2, 'source="init": key/value heads (num_heads must be a multiple)')
    head_dim: int = setting(32, 'source="init": width of one head')
    rope_theta: float = setting(10000.0, 'source="init": the rotary embedding base')
    dtype: str = setting("bfloat16", "compute dtype of every forward pass; weights move to the sampler in it")
    param_dtype: str = setting("float32", "dtype of the trained weights (f32: lr 1e-6 updates vanish in bf16)")
    scan_layers: bool = setting(True, "one layer's program scanned over the stack (shorter compiles for deep models)")
    remat: bool = setting(True, "recompute each layer's activations in the backward pass instead of keeping them")
    init_seed: int = setting(0, 'source="init": the seed of the random weights')
    lora_rank: int = setting(0, "0: full fine-tuning; r > 0: train rank-r LoRA adapters over the frozen base")
    lora_alpha: float = setting(16.0, "the adapters' scale is lora_alpha / lora_rank")
    lora_targets: tuple[str, ...] = setting(ALL_LORA_TARGETS, "the projections that get adapters")
    vocab_size: int | None = setting(None, 'source="init": the vocabulary size the planner assumes (the trainer '
                                           "takes it from the tokenizer; unset: the world's)")

    def lora_fields(self) -> dict:
        """model.lora_* as ModelConfig fields, as the trainer reads them (targets may be "q,v")."""
        targets = self.lora_targets
        if isinstance(targets, str):
            targets = [t.strip() for t in targets.split(",") if t.strip()]
        return dict(lora_rank=int(self.lora_rank), lora_alpha=float(self.lora_alpha), lora_targets=tuple(targets))

    def problems(self, training: bool = True) -> list[str]:
        """Dtypes, the LoRA settings and a random model's heads (that its source exists: machine_rules)."""
        from memsearcher_jax.models.config import DTYPES, LORA_TARGETS  # the models package loads JAX

        problems = [f"model.{key} must be one of {DTYPES}, got {self[key]!r}" for key in ("dtype", "param_dtype")
                    if self[key] not in DTYPES]
        lora = self.lora_fields()
        if lora["lora_rank"] < 0:
            problems.append(f"model.lora_rank must be >= 0 (0 = full fine-tuning), got {lora['lora_rank']}")
        elif lora["lora_rank"] > 0:
            bad = [t for t in lora["lora_targets"] if t not in LORA_TARGETS]
            if bad or not lora["lora_targets"]:
                problems.append(f"model.lora_targets must name some of {', '.join(LORA_TARGETS)}, got "
                                f"{self.lora_targets!r}")
            if not lora["lora_alpha"] > 0:
                problems.append(f"model.lora_alpha must be > 0, got {lora['lora_alpha']}")
        if self.source == "init" and (self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads):
            problems.append(f"model.num_heads={self.num_heads} must be a multiple of model.num_kv_heads="
                            f"{self.num_kv_heads} (each KV head serves a whole group of query heads)")
        return problems


@dataclasses.dataclass(frozen=True)
class WorldSettings(Section):
    """The synthetic multi-hop world: questions, corpus, tokenizer, and how many questions an episode asks at once."""
    key = "world"
    enabled: bool = setting(True, "the synthetic world supplies the questions, the corpus and the tokenizer "
                                  "(false: data.* and your retriever)")
    seed: int = setting(0, "the world's seed (its entities, facts and question order)")
    num_entities: int = setting(100, "entities in the world")
    whole_name_tokens: bool = setting(False, "give every name a token of its own (default: BPE merges syllable pieces)")
    heldout_by: str = setting("entity", '"entity": held-out names never asked about in training; "fact": held-out '
                                        "facts")
    cache_dir: str = setting("~/.cache/memsearcher-jax/worlds", "where built worlds are cached")
    objectives: int = setting(1, 'questions asked at once, joined "q1; q2" (answered "a1; a2"; MEM1\'s task); '
                                 "evaluation asks this many")
    objectives_mix: str = setting("", 'GRPO\'s training questions at several counts in equal shares ("1,2,3,4"); '
                                      '"": world.objectives only')
    objectives_schedule: str = setting("", 'GRPO\'s counts by step instead: "0:1,2;20:2,4;40:4,8" ("": off; '
                                           "rl/schedule.py)")
    schedule_advance_em: float = setting(0.0, "> 0: a schedule stage also ends once its last schedule_window steps' "
                                              "mean training EM reaches this")
    schedule_window: int = setting(5, "the steps whose mean EM world.schedule_advance_em reads")

    def problems(self, training: bool = True) -> list[str]:
        """world.objectives (data/synthetic.py's rule), the world's size, and the schedule of counts
        (its syntax is the cross-section objectives rule's, with world.objectives_mix's)."""
        problems = []
        try:
            check_objectives(self.objectives)
        except ValueError as e:
            problems.append(str(e))
        if self.enabled and self.num_entities < 1:
            problems.append(f"world.num_entities={self.num_entities}: the synthetic world needs >= 1 entity")
        schedule, advance = str(self.objectives_schedule).strip(), self.schedule_advance_em
        if schedule and str(self.objectives_mix).strip():
            problems.append(f"world.objectives_schedule={schedule!r} sets GRPO's question counts step by step, and "
                            f"world.objectives_mix={self.objectives_mix!r} sets them for every step; set "
                            "world.objectives_mix=''")
        if not 0 <= advance <= 1:
            problems.append(f"world.schedule_advance_em={advance}: a training EM in [0, 1] that ends a stage early "
                            "(0: off)")
        elif advance > 0 and not schedule:
            problems.append(f"world.schedule_advance_em={advance} ends a stage of world.objectives_schedule early, "
                            "which is '': set a schedule or world.schedule_advance_em=0")
        if self.schedule_window < 1:
            problems.append(f"world.schedule_window={self.schedule_window}: the steps whose mean EM "
                            "world.schedule_advance_em reads, expected >= 1")
        return problems


@dataclasses.dataclass(frozen=True)
class DataSettings(Section):
    """Your own questions, read when the synthetic world is off (world.enabled=false)."""
    key = "data"
    train_path: str = setting("", "world.enabled=false: the training questions, a FlashRAG jsonl or Search-R1 "
                                  "parquet file or directory")
    eval_path: str = setting("", "world.enabled=false: a directory of evaluation sets (the 7 benchmarks)")
    tokenizer_dir: str = setting("", '"": the model directory\'s tokenizer (or the world\'s)')


@dataclasses.dataclass(frozen=True)
class RetrievalSettings(Section):
    """The search tool's retriever: BM25 over the world, a saved index, or an HTTP server."""
    key = "retrieval"
    kind: str = setting("bm25", '"bm25" over the world\'s passages, "index" (a saved index directory) or "http" '
                                "(a retrieval server)")
    index_dir: str = setting("", 'kind="index": the index directory (memsearcher-jax index --out)')
    url: str = setting("", 'kind="http": the server\'s address')
    api: str = setting("memsearcher", 'kind="http": the server\'s protocol, "memsearcher" or "search-r1"')

    def problems(self, training: bool = True) -> list[str]:
        problems = []
        if self.kind not in ("bm25", "index", "http"):
            problems.append(f"retrieval.kind must be bm25, index or http, got {self.kind!r}")
        if self.kind == "http" and not self.url:
            problems.append("retrieval.kind=http needs retrieval.url")
        if self.kind == "index" and not self.index_dir:
            problems.append("retrieval.kind=index needs retrieval.index_dir")
        return problems


@dataclasses.dataclass(frozen=True)
class MeshSettings(Section):
    """The device mesh of training: data x fsdp x tp devices."""
    key = "mesh"
    data: int = setting(1, "devices that split the batch and hold whole copies of the weights")
    fsdp: int = setting(1, "devices that split the batch and shard the weights and optimizer state")
    tp: int = setting(1, "devices that split each layer (tensor parallelism; within a host)")


@dataclasses.dataclass(frozen=True)
class HardwareSettings(Section):
    """A pod's devices, read by the planner and the launchers (configs/recipe.py sets it); a config
    without this section plans against the machine it runs on."""
    key = "hardware"
    device_kind: str | None = setting(None, 'the accelerator, as JAX names it ("TPU v5 lite", "NVIDIA H100 80GB")')
    num_devices: int | None = setting(None, "devices JAX sees in the job (mesh.data x mesh.fsdp x mesh.tp)")
    device_memory_gib: float | None = setting(None, "memory of one device in GiB, the plan's capacity")
    hosts: int = setting(1, "hosts in the job (each samples its share of the rows on its own devices)")
    accelerator_type: str | None = setting(None, "TPU pods: the type launch/tpu_pod.py asks for (v5litepod-64)")
    runtime_version: str | None = setting(None, "TPU pods: the software image launch/tpu_pod.py asks for")
    nodes: int | None = setting(None, "GPU clusters: nodes launch/slurm_gpu.py asks for (unset: 1)")
    gpus_per_node: int | None = setting(None, "GPU clusters: GPUs per node (unset: 8)")
    usable_fraction: float = setting(0.9, "the share of a device's memory the plan may fill (XLA keeps the rest)")
