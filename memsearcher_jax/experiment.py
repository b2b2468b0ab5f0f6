"""An experiment from its config: validation, then every piece a job needs, built once.

    validate(cfg)                          # cheap checks naming the key, before anything compiles
    setup = build_setup(cfg)               # tokenizer, prompt builder, retriever, questions
    trainer = build_trainer(cfg, setup)    # meshes, learner, sampler, turn loop -> rl.trainer.Trainer
                                           # (a job: validation.check_training, then assemble_trainer)
    evaluate(eval_runner(cfg, setup, trainer.sampler), setup.eval_questions)

This is the only place that reads an ml-collections config for training and evaluation: below
it, `rl/`, `agent/`, `sampling/` and `models/` take typed dataclasses, and `rl/` never sees
data files or retrievers (it gets the questions and a built turn loop).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from memsearcher_jax import distributed
from memsearcher_jax.agent.prompts import (
    COMPACT_SYSTEM_PROMPT,
    COMPACT_UPDATE_INSTRUCTION,
    MEMORY_UPDATE_INSTRUCTION,
    PromptBuilder,
    memsearcher_system_prompt,
    react_system_prompt,
)
from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.agent.tools import tool_from_config
from memsearcher_jax.data.demos import EARLY_TWO_HOP, DemoConfig
from memsearcher_jax.data.qa import evaluation_sets, training_questions
from memsearcher_jax.data.synthetic import check_objectives, join_objectives, mix_objectives
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.vocab import ReadingVocab
from memsearcher_jax.data.world_cache import prepare_world
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.memory_estimates import lora_fields, turn_loop_buckets
from memsearcher_jax.models import (
    CausalLM,
    ModelConfig,
    ShardingConfig,
    from_pretrained,
    save_pretrained,
    shard_model,
)
from memsearcher_jax.models.config import DTYPES, LORA_TARGETS
from memsearcher_jax.models.hf_io import eos_token_ids
from memsearcher_jax.planner import check_fits
from memsearcher_jax.qa_metrics import compute_reward
from memsearcher_jax.rl.evaluation import evaluate
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig, sampling_model
from memsearcher_jax.rl.losses import LossConfig
from memsearcher_jax.rl.trainer import LoopConfig, Trainer
from memsearcher_jax.sampling import Sampler
from memsearcher_jax.sampling.sampler import check_query_block
from retrieval.bm25 import BM25Retriever
from retrieval.client import HTTPRetriever
from retrieval.loading import load_retriever


class TrainConfigError(UserInputError):
    """The training config is inconsistent; raised before anything is compiled."""


# ----------------------------------------------------------------------------- config -> typed
# Every dataclass below takes its fields from its config sections by name, so a field and its
# key cannot drift apart (tests/test_config_keys.py checks both directions against
# configs/default.py). A field computed from other keys is passed to `typed` explicitly.

SECTIONS_OF = {AgentConfig: ("agent",), LossConfig: ("rl",), GRPOConfig: ("rl",), OptimConfig: ("optim",),
               LoopConfig: ("train", "rl")}
COMPUTED_FIELDS = {AgentConfig: ("sampler_batch_size",), GRPOConfig: ("loss", "optim"),
                   LossConfig: ("temperature",),
                   OptimConfig: ("total_steps", "later_rates"),
                   LoopConfig: ("output_dir", "sampling_dtype")}
# Keys of those sections that no dataclass takes: read here, by name.
KEYS_READ_HERE = {"agent": ("eval_max_turns", "tool", "tool_schema", "stop_token_ids", "multi_answer_prompt"),
                  "rl": ("reward_fn",),
                  "train": ("eval_questions", "eval_per_set", "compilation_cache_dir")}


def typed(cls, cfg: ml_collections.ConfigDict, **computed):
    """cls(...) with every field not in `computed` read from the key of the same name in its
    config sections (SECTIONS_OF[cls]); TrainConfigError naming a key the config lacks."""
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in computed:
            continue
        section = next((s for s in SECTIONS_OF[cls] if f.name in cfg[s]), None)
        if section is None:
            raise TrainConfigError(f"the config has no {' or '.join(f'{s}.{f.name}' for s in SECTIONS_OF[cls])} "
                                   f"({cls.__name__}.{f.name}); start from configs/default.py, which has every key")
        values[f.name] = cfg[section][f.name]
    return cls(**values, **computed)


def agent_config(cfg: ml_collections.ConfigDict) -> AgentConfig:
    # Rows per sampler call live with the sampler's settings (the planner reads them there).
    return typed(AgentConfig, cfg, sampler_batch_size=int(cfg.sampler.batch_size))


def grpo_config(cfg: ml_collections.ConfigDict) -> GRPOConfig:
    # The cosine schedule's length: every optimizer step of the run. later_rates belong to
    # pretraining phases (memsearcher_jax/pretrain/), not to GRPO.
    optim = typed(OptimConfig, cfg, total_steps=cfg.train.steps * cfg.rl.optimizer_steps, later_rates=())
    # The learner scores tokens under the distribution the rollouts sampled from. Greedy (0) is refused
    # for training by config_problems; an evaluation config that sets it never trains.
    temperature = cfg.agent.temperature if cfg.agent.temperature > 0 else 1.0
    return typed(GRPOConfig, cfg, loss=typed(LossConfig, cfg, temperature=temperature), optim=optim)


def output_path(path: str) -> str:
    """A local output path made absolute; a remote one (gs://, s3://) as it is."""
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def loop_config(cfg: ml_collections.ConfigDict) -> LoopConfig:
    # Weights move to the sampler in the model's compute dtype.
    return typed(LoopConfig, cfg, output_dir=output_path(cfg.train.output_dir), sampling_dtype=cfg.model.dtype)


def prefill_query_block(cfg: ml_collections.ConfigDict) -> int:
    """sampler.prefill_query_block; TrainConfigError naming the key unless an integer >= 0."""
    try:
        return check_query_block(cfg.sampler.prefill_query_block)
    except ValueError as e:
        raise TrainConfigError(f"sampler.{e}") from None


def refuse(problems: list[str], what: str = "training config") -> None:
    """TrainConfigError listing `problems` (one line when there is one); nothing when there are none."""
    if len(problems) == 1:
        raise TrainConfigError(f"invalid {what}: {problems[0]}")
    if problems:
        raise TrainConfigError(f"invalid {what}:\n  - " + "\n  - ".join(problems))


def check_hosts(cfg: ml_collections.ConfigDict) -> None:
    """Training on several hosts: each rolls out an equal slice of rl.batch_questions."""
    if jax.process_count() > 1 and cfg.rl.batch_questions % jax.process_count():
        raise TrainConfigError(f"rl.batch_questions={cfg.rl.batch_questions} must be a multiple of the "
                               f"{jax.process_count()} hosts (each rolls out an equal slice)")


def validate(cfg: ml_collections.ConfigDict, training: bool = True) -> None:
    """TrainConfigError listing every problem `config_problems` finds (nothing when there are none)."""
    refuse(config_problems(cfg, training))


def config_problems(cfg: ml_collections.ConfigDict, training: bool = True) -> list[str]:
    """Cheap checks with messages naming the key, then the typed dataclasses' own checks (when
    the rest passed: they assume sane values). training=False (evaluation) asks for no training
    data and no groups. The one place of these rules; validation.check_config adds the files."""
    problems = []
    for key in ("batch_questions", "optimizer_steps", "micro_batch_size", "logprob_batch_size"):
        if cfg.rl[key] < 1:
            problems.append(f"rl.{key} must be >= 1, got {cfg.rl[key]}")
    if training and cfg.rl.group_size < 2:  # evaluation samples one episode a question: no groups
        problems.append(f"rl.group_size={cfg.rl.group_size}: GRPO's advantage compares the samples of a question "
                        "with each other, so it needs >= 2 (a group of one never learns)")
    if training and not cfg.agent.temperature > 0:
        problems.append(f"agent.temperature={cfg.agent.temperature}: GRPO samples its groups (greedy episodes "
                        "of one question are all the same); expected > 0 (the recipe's 1.0)")
    problems += value_problems(cfg)
    trajectories = cfg.rl.batch_questions * cfg.rl.group_size
    if cfg.rl.optimizer_steps > trajectories >= 1:
        problems.append(f"rl.optimizer_steps={cfg.rl.optimizer_steps} is more than a step's {trajectories} "
                        "trajectories (rl.batch_questions * rl.group_size): some mini-batches would be empty; "
                        f"set rl.optimizer_steps <= {trajectories}")
    try:
        prefill_query_block(cfg)
    except TrainConfigError as e:
        problems.append(str(e))
    if cfg.train.steps < 0:
        problems.append(f"train.steps must be >= 0, got {cfg.train.steps}")
    if cfg.train.save_every < 1 or cfg.train.keep < 1:
        problems.append("train.save_every and train.keep must be >= 1")
    if cfg.rl.filter_groups not in ("none", "zero_std"):
        problems.append(f"rl.filter_groups must be 'none' or 'zero_std', got {cfg.rl.filter_groups!r}")
    if cfg.rl.max_refill < 0:
        problems.append(f"rl.max_refill must be >= 0, got {cfg.rl.max_refill}")
    if cfg.rl.get("old_logprobs", "recompute") not in ("recompute", "sampler"):
        problems.append(f"rl.old_logprobs must be 'recompute' or 'sampler', got {cfg.rl.old_logprobs!r}")
    elif cfg.rl.get("old_logprobs") == "sampler" and cfg.sampler.cache_dtype != cfg.model.dtype:
        # The sampler then scores in another precision than the trainer: its log-probs are not the old policy's.
        problems.append(f"rl.old_logprobs='sampler' needs the sampler to run the trainer's dtype, but "
                        f"sampler.cache_dtype={cfg.sampler.cache_dtype!r} and model.dtype={cfg.model.dtype!r}; "
                        "set them equal or rl.old_logprobs='recompute'")
    try:
        load_reward_fn(cfg.rl.reward_fn)
    except TrainConfigError as e:
        problems.append(str(e))
    for key in ("eval_every", "eval_questions", "eval_per_set", "log_samples_every"):
        if cfg.train[key] < 0:
            problems.append(f"train.{key} must be >= 0, got {cfg.train[key]}")
    if cfg.retrieval.kind not in ("bm25", "index", "http"):
        problems.append(f"retrieval.kind must be bm25, index or http, got {cfg.retrieval.kind!r}")
    if cfg.retrieval.kind == "http" and not cfg.retrieval.url:
        problems.append("retrieval.kind=http needs retrieval.url")
    if cfg.retrieval.kind == "index" and not cfg.retrieval.index_dir:
        problems.append("retrieval.kind=index needs retrieval.index_dir")
    problems += objectives_problems(cfg)
    if cfg.sft.get("early_two_hop", "first_hop") not in EARLY_TWO_HOP:
        problems.append(f"sft.early_two_hop must be one of {', '.join(EARLY_TWO_HOP)}, got {cfg.sft.early_two_hop!r}")
    if cfg.sft.get("max_batch_tokens", 0) < 0:
        problems.append(f"sft.max_batch_tokens={cfg.sft.max_batch_tokens}: padded slots per SFT micro-batch, "
                        "expected >= 0 (0: no split)")
    if training and not cfg.world.enabled and cfg.sft.steps > 0:
        problems.append(f"sft.steps={cfg.sft.steps}: the warm start replays scripted demonstrations of the synthetic "
                        "world; with world.enabled=false set sft.steps=0 (start from an instruction-tuned model)")
    if training and not cfg.world.enabled and not cfg.data.train_path:
        problems.append("data.train_path is required when world.enabled is false")
    if not training and not cfg.world.enabled and not cfg.data.eval_path:
        problems.append("data.eval_path (a directory of evaluation sets) is required when world.enabled is false")
    problems += model_problems(cfg)
    if problems:
        return problems
    try:
        agent_config(cfg)
        grpo_config(cfg)
        loop_config(cfg)
    except (ValueError, TypeError) as e:
        return [str(e)]
    return []


def model_problems(cfg: ml_collections.ConfigDict) -> list[str]:
    """The model section's values: dtypes, LoRA settings, and a source that exists."""
    problems = []
    for key in ("dtype", "param_dtype"):  # checked here too so the message comes before any set-up
        if cfg.model[key] not in DTYPES:
            problems.append(f"model.{key} must be one of {DTYPES}, got {cfg.model[key]!r}")
    lora = lora_fields(cfg)
    if lora["lora_rank"] < 0:
        problems.append(f"model.lora_rank must be >= 0 (0 = full fine-tuning), got {lora['lora_rank']}")
    elif lora["lora_rank"] > 0:
        bad = [t for t in lora["lora_targets"] if t not in LORA_TARGETS]
        if bad or not lora["lora_targets"]:
            problems.append(f"model.lora_targets must name some of {', '.join(LORA_TARGETS)}, got "
                            f"{cfg.model.lora_targets!r}")
        if not lora["lora_alpha"] > 0:
            problems.append(f"model.lora_alpha must be > 0, got {lora['lora_alpha']}")
    if cfg.model.source != "init" and not os.path.isdir(os.path.expanduser(cfg.model.source)):
        problems.append(f"model.source {cfg.model.source!r} is neither 'init' nor a local model directory")
    return problems


def value_problems(cfg: ml_collections.ConfigDict) -> list[str]:
    """Values the typed dataclasses let through that would end in a traceback."""
    problems = []
    bad_ids = [v for v in cfg.agent.stop_token_ids if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    if bad_ids:
        problems.append(f"agent.stop_token_ids={tuple(cfg.agent.stop_token_ids)}: expected token ids (integers >= 0, "
                        f"e.g. --config.agent.stop_token_ids=151643,151645), got {bad_ids[0]!r}")
    if cfg.world.enabled and cfg.world.num_entities < 1:
        problems.append(f"world.num_entities={cfg.world.num_entities}: the synthetic world needs >= 1 entity")
    m = cfg.model
    if m.source == "init" and (m.num_kv_heads < 1 or m.num_heads % m.num_kv_heads):
        problems.append(f"model.num_heads={m.num_heads} must be a multiple of model.num_kv_heads={m.num_kv_heads} "
                        "(each KV head serves a whole group of query heads)")
    return problems


def objectives_problems(cfg: ml_collections.ConfigDict) -> list[str]:
    """world.objectives: an integer >= 1, and above 1 only on the synthetic world; each count of
    world.objectives_mix and sft.demo_objectives likewise."""
    n = cfg.world.objectives
    try:
        check_objectives(n)
        counts = demo_objective_counts(cfg)
        mix = train_objective_counts(cfg)
    except ValueError as e:
        return [str(e)]
    if n > 1 and not cfg.world.enabled:
        return [f"world.objectives={n} joins questions of the synthetic world; with world.enabled=false set "
                "world.objectives=1"]
    if max(mix) > 1 and not cfg.world.enabled:
        return [f"world.objectives_mix={cfg.world.objectives_mix!r} joins questions of the synthetic world; with "
                "world.enabled=false set world.objectives_mix=''"]
    if max(counts) > 1 and not cfg.world.enabled:
        return [f"sft.demo_objectives={cfg.sft.demo_objectives!r} joins questions of the synthetic world; with "
                "world.enabled=false set sft.demo_objectives=''"]
    return []


def parse_objective_counts(spec, key: str, default: int) -> tuple[int, ...]:
    """A comma-separated list of objective counts ("1,2") as a tuple; "" means (default,).
    ValueError naming the key for anything but comma-separated integers >= 1."""
    spec = str(spec).strip()
    if not spec:
        return (default,)
    try:
        counts = tuple(int(x) for x in spec.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise ValueError(f"{key} must be comma-separated integers >= 1 (e.g. '1,2'; '' for world.objectives), "
                         f"got {spec!r}")
    return counts


def demo_objective_counts(cfg: ml_collections.ConfigDict) -> tuple[int, ...]:
    """`sft.demo_objectives` ("1,2") as counts; "" means the training questions' counts."""
    if not str(cfg.sft.demo_objectives).strip():
        return train_objective_counts(cfg)
    return parse_objective_counts(cfg.sft.demo_objectives, "sft.demo_objectives", cfg.world.objectives)


def train_objective_counts(cfg: ml_collections.ConfigDict) -> tuple[int, ...]:
    """`world.objectives_mix` ("1,2,3,4") as counts: GRPO's training questions in equal shares at
    each; "" means world.objectives alone. Evaluation asks world.objectives (or --objectives)."""
    return parse_objective_counts(cfg.world.get("objectives_mix", ""), "world.objectives_mix", cfg.world.objectives)


def auto_flag(cfg: ml_collections.ConfigDict, section: str, key: str) -> str:
    """A setting that is "auto", True or False (a bool or its spelling), as "auto" / "true" / "false";
    UserInputError naming the key for anything else."""
    value = cfg[section].get(key, "auto")
    mode = str(value).strip().lower()
    if mode not in ("auto", "true", "false"):
        raise UserInputError(f"{section}.{key}={value!r}: expected auto, True or False")
    return mode


def multi_answer_prompt(cfg: ml_collections.ConfigDict) -> bool:
    """Whether the system prompts state the N-answer format (`agent.multi_answer_prompt`): "auto"
    states it when the task asks several questions at once, in the world (world.objectives) or in
    the warm start's demonstrations (sft.demo_objectives); True / False force it."""
    mode = auto_flag(cfg, "agent", "multi_answer_prompt")
    if mode == "auto":
        return max(cfg.world.objectives, *demo_objective_counts(cfg), *train_objective_counts(cfg)) > 1
    return mode == "true"


def demo_config(cfg: ml_collections.ConfigDict) -> DemoConfig:
    """The demonstrator's settings: its deliberate flaws at the `sft.*_rate` settings, and turns
    enough for the objectives its questions ask (`sft.demo_objectives`)."""
    rates = {k: cfg.sft[k] for k in ("vague_query_rate", "wrong_answer_rate", "early_answer_rate", "two_hop_early_rate",
                                     "early_two_hop", "react_share") if k in cfg.sft}
    # A script of N objectives needs up to 2N + 2 turns (a search per hop and a recovery search); the
    # demonstrations may show more objectives than the training episodes ask (sft.demo_objectives).
    turns = max(4, cfg.agent.max_turns, 2 * max(demo_objective_counts(cfg)) + 2)
    return DemoConfig(max_turns=turns, top_n=cfg.agent.default_top_n, workflow=cfg.agent.workflow, **rates)


def demo_questions(cfg: ml_collections.ConfigDict, setup: Setup) -> list[dict]:
    """The first `sft.num_demos` training questions the demonstrator scripts: the training set
    as GRPO sees it, or (sft.demo_objectives) equal shares at each objective count, interleaved
    so any prefix keeps the shares."""
    counts = demo_objective_counts(cfg)
    if not str(cfg.sft.demo_objectives).strip() or setup.world is None:
        return setup.train_questions[: cfg.sft.num_demos]  # the training set itself (also with no world)
    return mix_objectives(read_jsonl(setup.world.train), counts, seed=cfg.world.seed)[: cfg.sft.num_demos]


def load_reward_fn(spec: str) -> Callable:
    """`rl.reward_fn`: "" for the MemSearcher reward, else "module:function" or
    "path/to/file.py:function", a callable with `compute_reward`'s signature
    (blocks, ended_with_eos, golds) -> RewardResult."""
    if not spec:
        return compute_reward
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise TrainConfigError(f"rl.reward_fn={spec!r}: expected 'module:function' or 'file.py:function'")
    try:
        if where.endswith(".py"):
            loader = importlib.util.spec_from_file_location(f"_reward_{abs(hash(where))}", os.path.expanduser(where))
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except (ImportError, FileNotFoundError, SyntaxError) as e:
        raise TrainConfigError(f"rl.reward_fn={spec!r}: cannot load {where!r}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise TrainConfigError(f"rl.reward_fn={spec!r}: {where!r} has no callable {name!r}")
    return fn


# ----------------------------------------------------------------------------- data, tokenizer, retriever

@dataclasses.dataclass
class Setup:
    tokenizer: Any
    builder: PromptBuilder
    retriever: Any
    train_questions: list[dict]
    eval_questions: list[dict]
    tokenizer_dir: str
    world: Any = None
    eval_sets: dict[str, list[dict]] = dataclasses.field(default_factory=dict)  # name -> questions
    missing_eval_sets: dict[str, str] = dataclasses.field(default_factory=dict)  # paper sets not found: why


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def build_setup(cfg: ml_collections.ConfigDict, training: bool = True) -> Setup:
    """Tokenizer, prompt builder, retriever and questions. training=False skips the training set."""
    # What the set-up reads from the config alone, read (and refused) before anything is built.
    multi_answer, counts = multi_answer_prompt(cfg), train_objective_counts(cfg)
    vocab_dir = reading_vocab_dir(cfg) if cfg.world.enabled else None
    tool = tool_from_config(cfg.agent.tool, cfg.agent.tool_schema)
    world_paths = None
    if cfg.world.enabled:
        extra = (memsearcher_system_prompt(cfg.agent.default_top_n), react_system_prompt(cfg.agent.default_top_n),
                 MEMORY_UPDATE_INSTRUCTION, COMPACT_SYSTEM_PROMPT, COMPACT_UPDATE_INSTRUCTION)
        world_paths = prepare_world(os.path.expanduser(cfg.world.cache_dir), seed=cfg.world.seed,
                                    num_entities=cfg.world.num_entities, extra_texts=extra,
                                    heldout_by=cfg.world.heldout_by, whole_names=cfg.world.whole_name_tokens,
                                    vocab_dir=vocab_dir)
    tok_dir = cfg.data.tokenizer_dir or (world_paths.tokenizer_dir if world_paths else cfg.model.source)
    tokenizer = load_tokenizer(os.path.expanduser(tok_dir))
    if world_paths is not None:
        n = cfg.world.objectives
        train_q = mix_objectives(read_jsonl(world_paths.train), counts, seed=cfg.world.seed)
        eval_sets = {"synthetic-heldout": join_objectives(read_jsonl(world_paths.heldout), n, seed=cfg.world.seed)}
        missing_sets: dict[str, str] = {}
    else:
        train_q = training_questions(os.path.expanduser(cfg.data.train_path)) if training else []
        eval_sets, missing_sets = (evaluation_sets(os.path.expanduser(cfg.data.eval_path)) if cfg.data.eval_path
                                   else ({}, {}))
    stop_ids, retriever = stop_token_ids(cfg, tokenizer), build_retriever(cfg, world_paths)
    builder = PromptBuilder(tokenizer, default_top_n=cfg.agent.default_top_n, style=cfg.agent.prompt_style,
                            stop_ids=stop_ids, tool=tool, multi_answer=multi_answer)
    return Setup(tokenizer=tokenizer, builder=builder, retriever=retriever,
                 train_questions=train_q, eval_questions=[row for rows in eval_sets.values() for row in rows],
                 tokenizer_dir=tok_dir, world=world_paths, eval_sets=eval_sets, missing_eval_sets=missing_sets)


def with_objectives(setup: Setup, n: int, seed: int = 0) -> Setup:
    """The same set-up (tokenizer, retriever) asking `n` synthetic-world questions at once, in
    training and in evaluation: e.g. a run trained on 2 objectives evaluated on 1, 4 or 8."""
    if setup.world is None:
        raise TrainConfigError(f"objectives={n} joins questions of the synthetic world; this set-up has none "
                               "(world.enabled=false)")
    eval_sets = {"synthetic-heldout": join_objectives(read_jsonl(setup.world.heldout), n, seed=seed)}
    return dataclasses.replace(setup, train_questions=join_objectives(read_jsonl(setup.world.train), n, seed=seed),
                               eval_sets=eval_sets, eval_questions=list(eval_sets["synthetic-heldout"]))


def reading_vocab_dir(cfg: ml_collections.ConfigDict) -> str | None:
    """model.source when it ships a reading vocabulary (the pretrained base does): the synthetic
    world then names its entities from the vocabulary's reserved pool and uses its tokenizer."""
    source = os.path.expanduser(cfg.model.source)
    return source if cfg.model.source != "init" and ReadingVocab.exists(source) else None


def stop_token_ids(cfg: ml_collections.ConfigDict, tokenizer) -> list[int]:
    """What every generation call stops on besides <|im_end|>: `agent.stop_token_ids` when set,
    else the tokenizer's eos and every eos id of the model directory (model.source)."""
    override = [int(i) for i in cfg.agent.stop_token_ids]
    if override:
        return override
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    source = os.path.expanduser(cfg.model.source)
    if cfg.model.source != "init" and os.path.isdir(source):
        ids += eos_token_ids(source)
    return ids


def build_retriever(cfg: ml_collections.ConfigDict, world_paths=None):
    kind = cfg.retrieval.kind
    if kind == "http":
        return HTTPRetriever(cfg.retrieval.url, api=cfg.retrieval.api)
    if kind == "index":
        return load_retriever(os.path.expanduser(cfg.retrieval.index_dir))
    if world_paths is None:
        raise TrainConfigError("retrieval.kind=bm25 without a saved index needs the synthetic world; "
                               "use retrieval.kind=index with a directory built by `memsearcher-jax index`")
    return BM25Retriever.from_passages(read_jsonl(world_paths.corpus))


# ----------------------------------------------------------------------------- model, meshes, sampler

def load_policy(cfg: ml_collections.ConfigDict, setup: Setup, source: str | None = None, lora: bool = True) -> CausalLM:
    """The policy model.source (or `source`) gives, with fresh LoRA adapters when model.lora_rank > 0
    (lora=False: without them, e.g. for the supervised warm start, which trains every weight)."""
    source, m = source or cfg.model.source, cfg.model
    adapters = lora_fields(cfg) if lora else {}
    if source == "init":
        vocab = -(-len(setup.tokenizer) // 64) * 64  # pad the vocabulary to a multiple of 64
        mc = ModelConfig.from_preset(
            m.preset, vocab_size=vocab, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
            num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
            rope_theta=m.rope_theta, dtype=m.dtype, param_dtype=m.param_dtype, scan_layers=m.scan_layers,
            remat=m.remat, eos_token_id=setup.builder.eos_id, bos_token_id=setup.builder.pad_id, **adapters)
        return CausalLM(mc, rngs=nnx.Rngs(m.init_seed))
    return from_pretrained(os.path.expanduser(source), dtype=m.dtype, param_dtype=m.param_dtype,
                           scan_layers=m.scan_layers, remat=m.remat, **adapters)


def build_sampler(cfg: ml_collections.ConfigDict, model: CausalLM, mesh, layer_by_layer: bool = False,
                  to_local=None) -> Sampler:
    """The Sampler the config asks for (cache dtype, prefill query block) over `model` on `mesh`.
    layer_by_layer / to_local: as Sampler takes them (a LoRA trainer's sampler). Buckets: the
    turn loop's coarse ones (planner.turn_loop_buckets), so a run compiles its programs early."""
    block, buckets = prefill_query_block(cfg), turn_loop_buckets(cfg, jax.process_count())
    return Sampler(model, cache_dtype=jnp.dtype(cfg.sampler.cache_dtype), mesh=mesh, buckets=buckets,
                   prefill_query_block=block, layer_by_layer=layer_by_layer, to_local=to_local)


def learner_and_sampler_meshes(cfg: ml_collections.ConfigDict):
    """(learner mesh, sampler mesh) of cfg.mesh (distributed.learner_and_sampler_meshes)."""
    return distributed.learner_and_sampler_meshes(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp)


def sampling_mesh(cfg: ml_collections.ConfigDict):
    """The mesh a sampler of `cfg` runs on when there is no learner (evaluation)."""
    return learner_and_sampler_meshes(cfg)[1]


def lora_base_dir(cfg: ml_collections.ConfigDict, policy: CausalLM, source: str | None) -> str:
    """The Hugging Face directory of a LoRA run's frozen base, recorded in its checkpoints (which
    hold the adapters alone; export and evaluation load the base from here): `source`, the
    directory the policy was loaded from (the warm start's), else model.source, else (a random
    init) the base written once to OUTPUT/lora_base."""
    if source:
        return os.path.abspath(os.path.expanduser(source))
    if cfg.model.source != "init":
        return os.path.abspath(os.path.expanduser(cfg.model.source))
    out = os.path.join(output_path(cfg.train.output_dir), "lora_base")
    if not os.path.isfile(os.path.join(out, "config.json")) and jax.process_index() == 0:
        save_pretrained(policy, out)  # adapters merged: B is zero, so these are the base weights exactly
    return out


def build_trainer(cfg: ml_collections.ConfigDict, setup: Setup | None = None, progress: bool = True) -> Trainer:
    """validate(cfg) and check the plan fits, build the set-up unless given, then assemble_trainer
    (a job checks first, with validation.check_training, and assembles)."""
    validate(cfg)
    check_fits(cfg)  # refuse a config that cannot fit its devices, before compiling anything
    check_hosts(cfg)
    return assemble_trainer(cfg, setup or build_setup(cfg), progress=progress)


def assemble_trainer(cfg: ml_collections.ConfigDict, setup: Setup, source: str | None = None,
                     progress: bool = True) -> Trainer:
    """The learner, the sampler and the turn loop for a checked config and its set-up, on the policy
    loaded from `source` (a Hugging Face directory, e.g. the warm start's; None: model.source)."""
    # What the pieces take from the config, read once before any is built.
    grpo, agent, loop = grpo_config(cfg), agent_config(cfg), loop_config(cfg)
    reward_fn, held_out = load_reward_fn(cfg.rl.reward_fn), eval_questions(cfg, setup)
    mesh, sampler_mesh = learner_and_sampler_meshes(cfg)
    policy = load_policy(cfg, setup, source)
    meta = {"tokenizer_dir": os.path.abspath(os.path.expanduser(setup.tokenizer_dir))}
    lora = policy.config.lora
    if lora:
        meta["lora_base"] = lora_base_dir(cfg, policy, source)
    if mesh is not None:
        policy = shard_model(policy, mesh, ShardingConfig.training())
    learner = GRPOLearner(policy, grpo, mesh=mesh)
    # LoRA: the sampler merges the adapters into its own copy one layer at a time, straight from
    # the learner's frozen FSDP base (on several hosts, each piece is then made host-local).
    to_local = ((lambda tree: distributed.to_local_arrays(tree, sampler_mesh))
                if lora and jax.process_count() > 1 else None)
    weights = sampling_model(learner, mesh, sampler_mesh, cfg.model.dtype)
    sampler = build_sampler(cfg, weights, sampler_mesh, layer_by_layer=lora, to_local=to_local)
    runner = AgentRunner(setup.builder, sampler, setup.retriever, agent)
    evaluate_fn = (lambda s: {k: v for k, v in evaluate(eval_runner(cfg, setup, s), held_out).items()
                              if k in ("em", "f1", "turns", "format_ok")}) if held_out else None
    return Trainer(learner, runner, setup.train_questions, setup.builder.pad_id, loop, mesh=mesh,
                   sampler_mesh=sampler_mesh, progress=progress, evaluate=evaluate_fn, reward_fn=reward_fn, meta=meta)


# ----------------------------------------------------------------------------- evaluation (rl/evaluation.py runs it)

def eval_runner(cfg: ml_collections.ConfigDict, setup: Setup, sampler, workflow: str | None = None) -> AgentRunner:
    """The turn loop as evaluation runs it: greedy, up to agent.eval_max_turns turns."""
    agent = agent_config(cfg).evaluation(cfg.agent.eval_max_turns)
    if workflow:
        agent = dataclasses.replace(agent, workflow=workflow)
    return AgentRunner(setup.builder, sampler, setup.retriever, agent)


def eval_questions(cfg: ml_collections.ConfigDict, setup: Setup) -> list[dict]:
    """The held-out questions a run scores (before/after and every train.eval_every steps): the
    first train.eval_per_set of every evaluation set when that is set, else the first
    train.eval_questions of them all."""
    if cfg.train.eval_per_set:
        return [q for rows in setup.eval_sets.values() for q in rows[:cfg.train.eval_per_set]]
    return setup.eval_questions[:cfg.train.eval_questions]
