"""An experiment from its settings: every piece a job needs, built once, from checked settings.

    cfg = load_settings("configs/default.py")   # the typed Settings (a ConfigDict: Settings.from_config)
    check_config(cfg)                      # config_rules: every problem of the config, then the plan
    setup = build_setup(cfg)               # tokenizer, prompt builder, retriever, questions
    trainer = build_trainer(cfg, setup)    # checks (check_config), then meshes, learner, sampler,
                                           # turn loop -> rl.trainer.Trainer (a job:
                                           # validation.check_training, then assemble_trainer)
    evaluate(eval_runner(cfg, setup, trainer.sampler), setup.eval_questions)

The config's rules and its typed readers (config -> the dataclasses `agent/` and `rl/` take) are
config_rules.py's, below this module; here the config becomes the heavy pieces. Below both,
`rl/`, `agent/`, `sampling/` and `models/` take typed dataclasses, and `rl/` never sees data files
or retrievers (it gets the questions and a built turn loop).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from memsearcher_jax.agent.prompts import (
    COMPACT_SYSTEM_PROMPT,
    COMPACT_UPDATE_INSTRUCTION,
    MEMORY_UPDATE_INSTRUCTION,
    PromptBuilder,
    memsearcher_system_prompt,
    react_system_prompt,
)
from memsearcher_jax.agent.rollout import AgentRunner
from memsearcher_jax.agent.tools import tool_from_config
from memsearcher_jax.data.demos import DemoConfig
from memsearcher_jax.data.qa import evaluation_sets, training_questions
from memsearcher_jax.data.synthetic import join_objectives, mix_objectives, parse_objectives_schedule
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.vocab import ReadingVocab
from memsearcher_jax.data.world_cache import prepare_world
from memsearcher_jax.models import (
    CausalLM,
    ModelConfig,
    ShardingConfig,
    from_pretrained,
    save_pretrained,
    shard_model,
)
from memsearcher_jax.models.hf_io import eos_token_ids
from memsearcher_jax.plan.memory_estimates import lora_fields, turn_loop_buckets
from memsearcher_jax.rl.evaluation import evaluate
from memsearcher_jax.rl.grpo import GRPOLearner
from memsearcher_jax.rl.sampler_weights import sampling_model
from memsearcher_jax.rl.schedule import QuestionSchedule
from memsearcher_jax.rl.trainer import Trainer
from memsearcher_jax.rules.config_rules import (  # validate, config_problems: the rules' face for library users
    TrainConfigError,
    agent_config,
    check_config,
    config_problems as config_problems,
    demo_objective_counts,
    grpo_config,
    load_reward_fn,
    loop_config,
    multi_answer_prompt,
    output_path,
    prefill_query_block,
    train_objective_counts,
    validate as validate,
)
from memsearcher_jax.runtime import distributed
from memsearcher_jax.runtime.jsonl import read_jsonl
from memsearcher_jax.sampling import Sampler
from memsearcher_jax.settings import ModelSettings, RetrievalSettings, Settings, TrainSettings, WorldSettings
from retrieval.bm25 import BM25Retriever
from retrieval.client import HTTPRetriever
from retrieval.loading import load_retriever

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


def build_setup(cfg: Settings, training: bool = True) -> Setup:
    """Tokenizer, prompt builder, retriever and questions. training=False skips the training set."""
    # What the set-up reads from the config alone, read (and refused) before anything is built.
    vocab_dir = reading_vocab_dir(cfg.model) if cfg.world.enabled else None
    multi_answer, counts = multi_answer_prompt(cfg), train_objective_counts(cfg)
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
    stop_ids, retriever = stop_token_ids(cfg, tokenizer), build_retriever(cfg.retrieval, world_paths)
    builder = PromptBuilder(tokenizer, default_top_n=cfg.agent.default_top_n, style=cfg.agent.prompt_style,
                            stop_ids=stop_ids, tool=tool, multi_answer=multi_answer, hint=cfg.agent.hint)
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


def reading_vocab_dir(model: ModelSettings) -> str | None:
    """model.source when it ships a reading vocabulary (the pretrained base does): the synthetic
    world then names its entities from the vocabulary's reserved pool and uses its tokenizer."""
    source = os.path.expanduser(model.source)
    return source if model.source != "init" and ReadingVocab.exists(source) else None


def stop_token_ids(cfg: Settings, tokenizer) -> list[int]:
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


def build_retriever(retrieval: RetrievalSettings, world_paths=None):
    kind = retrieval.kind
    if kind == "http":
        return HTTPRetriever(retrieval.url, api=retrieval.api)
    if kind == "index":
        return load_retriever(os.path.expanduser(retrieval.index_dir))
    if world_paths is None:
        raise TrainConfigError("retrieval.kind=bm25 without a saved index needs the synthetic world; "
                               "use retrieval.kind=index with a directory built by `memsearcher-jax index`")
    return BM25Retriever.from_passages(read_jsonl(world_paths.corpus))


# ----------------------------------------------------------------------------- the warm start's demonstrator

def demo_config(cfg: Settings) -> DemoConfig:
    """The demonstrator's settings: its deliberate flaws at the `sft.*_rate` settings, and turns
    enough for the objectives its questions ask (`sft.demo_objectives`)."""
    rates = {k: cfg.sft[k] for k in ("vague_query_rate", "wrong_answer_rate", "early_answer_rate", "two_hop_early_rate",
                                     "early_two_hop", "early_several", "react_share", "no_result_note")}
    # A script of N objectives needs up to 2N + 2 turns (a search per hop and a recovery search); the
    # demonstrations may show more objectives than the training episodes ask (sft.demo_objectives).
    turns = max(4, cfg.agent.max_turns, 2 * max(demo_objective_counts(cfg)) + 2)
    per_question = cfg.agent.turns_per_question
    if per_question or cfg.agent.hint != "none":
        # A turn budget per count, or a hint that states it: each demo gets its episode's own budget
        # (AgentConfig.episode_turns), so the warm start shows the turns left the rollouts will show.
        turns = max(4, cfg.agent.max_turns)
    return DemoConfig(max_turns=turns, turns_per_question=per_question, top_n=cfg.agent.default_top_n,
                      workflow=cfg.agent.workflow, **rates)


def demo_questions(cfg: Settings, setup: Setup) -> list[dict]:
    """The first `sft.num_demos` training questions the demonstrator scripts: the training set
    as GRPO sees it, or (sft.demo_objectives) equal shares at each objective count, interleaved
    so any prefix keeps the shares."""
    counts = demo_objective_counts(cfg)
    if not str(cfg.sft.demo_objectives).strip() or setup.world is None:
        return setup.train_questions[: cfg.sft.num_demos]  # the training set itself (also with no world)
    return mix_objectives(read_jsonl(setup.world.train), counts, seed=cfg.world.seed)[: cfg.sft.num_demos]


# ----------------------------------------------------------------------------- model, meshes, sampler

def load_policy(cfg: Settings, setup: Setup, source: str | None = None, lora: bool = True) -> CausalLM:
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


def build_sampler(cfg: Settings, model: CausalLM, mesh, layer_by_layer: bool = False,
                  to_local=None) -> Sampler:
    """The Sampler the config asks for (cache dtype, prefill query block) over `model` on `mesh`.
    layer_by_layer / to_local: as Sampler takes them (a LoRA trainer's sampler). Buckets: the
    turn loop's coarse ones (planner.turn_loop_buckets), so a run compiles its programs early."""
    block, buckets = prefill_query_block(cfg.sampler), turn_loop_buckets(cfg, jax.process_count())
    return Sampler(model, cache_dtype=jnp.dtype(cfg.sampler.cache_dtype), mesh=mesh, buckets=buckets,
                   prefill_query_block=block, layer_by_layer=layer_by_layer, to_local=to_local)


def learner_and_sampler_meshes(cfg: Settings):
    """(learner mesh, sampler mesh) of cfg.mesh and sampler.devices (distributed.learner_and_sampler_meshes)."""
    return distributed.learner_and_sampler_meshes(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp, cfg.sampler.devices)


def sampling_mesh(cfg: Settings):
    """The mesh a sampler of `cfg` runs on when there is no learner (evaluation)."""
    return learner_and_sampler_meshes(cfg)[1]


def lora_base_dir(cfg: Settings, policy: CausalLM, source: str | None) -> str:
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


def build_trainer(cfg: Settings, setup: Setup | None = None, progress: bool = True) -> Trainer:
    """check_config(cfg) (every rule, then whether the plan fits: the pass a job makes first), build
    the set-up unless given, then assemble_trainer (a job: validation.check_training, then assembles)."""
    check_config(cfg)
    return assemble_trainer(cfg, setup or build_setup(cfg), progress=progress)


def assemble_trainer(cfg: Settings, setup: Setup, source: str | None = None,
                     progress: bool = True) -> Trainer:
    """The learner, the sampler and the turn loop for a checked config and its set-up, on the policy
    loaded from `source` (a Hugging Face directory, e.g. the warm start's; None: model.source)."""
    # What the pieces take from the config, read once before any is built.
    held_out = eval_questions(cfg.train, setup)
    grpo, loop, reward_fn = grpo_config(cfg), loop_config(cfg), load_reward_fn(cfg.rl.reward_fn)
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
    runner = training_runner(cfg, setup, sampler)
    evaluate_fn = (lambda s: {k: v for k, v in evaluate(eval_runner(cfg, setup, s), held_out).items()
                              if k in ("em", "f1", "turns", "format_ok")}) if held_out else None
    return Trainer(learner, runner, setup.train_questions, setup.builder.pad_id, loop, mesh=mesh,
                   sampler_mesh=sampler_mesh, progress=progress, evaluate=evaluate_fn, reward_fn=reward_fn, meta=meta,
                   schedule=question_schedule(cfg.world, setup))


def question_schedule(world: WorldSettings, setup: Setup) -> QuestionSchedule | None:
    """`world.objectives_schedule` as the trainer's QuestionSchedule: each stage's pool the world's
    training questions joined at its counts in equal shares (as world.objectives_mix joins them);
    None when it is '' (the trainer then takes setup.train_questions throughout)."""
    stages = parse_objectives_schedule(world.objectives_schedule)
    if not stages or setup.world is None:
        return None
    rows = read_jsonl(setup.world.train)
    return QuestionSchedule(pools=tuple(mix_objectives(rows, counts, seed=world.seed) for _, counts in stages),
                            starts=tuple(step for step, _ in stages), counts=tuple(c for _, c in stages),
                            advance_em=float(world.schedule_advance_em), window=int(world.schedule_window))


# ----------------------------------------------------------------------------- evaluation (rl/evaluation.py runs it)

def training_runner(cfg: Settings, setup: Setup, sampler) -> AgentRunner:
    """The turn loop as GRPO's rollouts run it: the training agent (temperature, top-p, agent.max_turns);
    the RFT control and bench/episode_report.py --sampled sample with this same one."""
    return AgentRunner(setup.builder, sampler, setup.retriever, agent_config(cfg))


def eval_runner(cfg: Settings, setup: Setup, sampler, workflow: str | None = None) -> AgentRunner:
    """The turn loop as evaluation runs it: greedy, up to agent.eval_max_turns turns."""
    agent = agent_config(cfg).evaluation(cfg.agent.eval_max_turns)
    if workflow:
        agent = dataclasses.replace(agent, workflow=workflow)
    return AgentRunner(setup.builder, sampler, setup.retriever, agent)


def eval_questions(train: TrainSettings, setup: Setup) -> list[dict]:
    """The held-out questions a run scores (before/after and every train.eval_every steps): the
    first train.eval_per_set of every evaluation set when that is set, else the first
    train.eval_questions of them all."""
    if train.eval_per_set:
        return [q for rows in setup.eval_sets.values() for q in rows[:train.eval_per_set]]
    return setup.eval_questions[:train.eval_questions]
