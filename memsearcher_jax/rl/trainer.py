"""The GRPO training loop: setup from a config, rollouts, updates, checkpoints, metrics.

The math of one step lives in `rl/grpo.py` and the turn loop in `agent/rollout.py`; this file
is the orchestration around them: build everything (validating the config before anything is
compiled), resume from the latest checkpoint, and for each step
    questions -> AgentRunner (sampler + retriever) -> rewards -> rows -> GRPOLearner update
with metrics to TensorBoard + JSONL and a progress bar.

Multi-host (jax.process_count() > 1, after `distributed.initialize_from_env`): the learner
runs on the global mesh; each host rolls out its contiguous slice of the step's questions
(`host_shard`) with a sampler on its own devices (`distributed.local_mesh`), scores and packs
its rows, and `distributed.allgather_rows` gives every host the same global rows, in the
order one process would have packed them, for the unchanged update. Trajectory and group ids
are global and every trajectory samples from (step seed, its traj_id), so N hosts draw the
same tokens as one process.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
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
from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner, Trajectory
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.models import ModelConfig, Qwen2, ShardingConfig, from_pretrained, make_mesh, shard_model
from memsearcher_jax.models.config import DTYPES
from memsearcher_jax.models.hf_io import eos_token_ids
from memsearcher_jax.rl.advantages import zero_variance_fraction
from memsearcher_jax.rl.grpo import (
    GRPOConfig,
    GRPOLearner,
    OptimConfig,
    RowBatch,
    pack_rows,
    score_trajectories,
    trajectory_advantages,
)
from memsearcher_jax.rl.losses import LossConfig


class TrainConfigError(UserInputError):
    """The training config is inconsistent; raised before anything is compiled."""


# ----------------------------------------------------------------------------- config -> typed

def agent_config(cfg: ml_collections.ConfigDict) -> AgentConfig:
    fields = {f.name for f in dataclasses.fields(AgentConfig)}
    values = {k: v for k, v in cfg.agent.to_dict().items() if k in fields}
    # Rows per sampler call live with the sampler's settings (the planner reads them there).
    return AgentConfig(**values, sampler_batch_size=int(cfg.sampler.get("batch_size", 0) or 0))


def grpo_config(cfg: ml_collections.ConfigDict) -> GRPOConfig:
    rl = cfg.rl
    # Optional keys (older config files lack them) fall back to the recipe's values.
    extra = {k: rl[k] for k in ("kl_clamp", "log_ratio_clamp", "kl_estimator") if k in rl}
    loss = LossConfig(clip_low=rl.clip_low, clip_high=rl.clip_high, dual_clip=rl.dual_clip, kl_coef=rl.kl_coef,
                      entropy_coef=rl.entropy_coef, aggregation=rl.aggregation, **extra)
    optim = OptimConfig(**cfg.optim.to_dict())
    return GRPOConfig(optimizer_steps=rl.optimizer_steps, micro_batch_size=rl.micro_batch_size,
                      logprob_batch_size=rl.logprob_batch_size, shuffle_rows=rl.shuffle_rows,
                      min_seq_len=rl.min_seq_len, loss=loss, optim=optim)


def prefill_query_block(cfg: ml_collections.ConfigDict) -> int:
    """sampler.prefill_query_block, or the Sampler's default when the config names none;
    ValueError naming the key when it is not an integer >= 0."""
    from memsearcher_jax.sampling.sampler import DEFAULT_QUERY_BLOCK, check_query_block

    try:
        return check_query_block(cfg.sampler.get("prefill_query_block", DEFAULT_QUERY_BLOCK))
    except ValueError as e:
        raise ValueError(f"sampler.{e}") from None


def build_sampler(cfg: ml_collections.ConfigDict, model: Qwen2, mesh):
    """The Sampler the config asks for (cache dtype, prefill query block) over `model` on `mesh`."""
    from memsearcher_jax.sampling import Sampler

    return Sampler(model, cache_dtype=jnp.dtype(cfg.sampler.cache_dtype), mesh=mesh,
                   prefill_query_block=prefill_query_block(cfg))


def sampling_mesh(cfg: ml_collections.ConfigDict):
    """The mesh a sampler of `cfg` runs on when there is no learner (evaluation): the config's
    mesh on one process, this host's own devices on several (each host samples on its own).
    None for one device."""
    n_dev = cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tp
    if jax.process_count() > 1:
        return distributed.local_mesh(cfg.mesh.tp)
    if n_dev > 1:
        return make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp, devices=jax.devices()[:n_dev])
    return None


def validate(cfg: ml_collections.ConfigDict, training: bool = True) -> None:
    """Cheap checks with messages naming the key; everything typed is validated by its dataclass.

    training=False (evaluation) does not ask for training data."""
    problems = []
    for key in ("batch_questions", "group_size", "optimizer_steps", "micro_batch_size", "logprob_batch_size"):
        if cfg.rl[key] < 1:
            problems.append(f"rl.{key} must be >= 1, got {cfg.rl[key]}")
    try:
        prefill_query_block(cfg)
    except ValueError as e:
        problems.append(str(e))
    if cfg.train.steps < 0:
        problems.append(f"train.steps must be >= 0, got {cfg.train.steps}")
    if cfg.train.save_every < 1 or cfg.train.keep < 1:
        problems.append("train.save_every and train.keep must be >= 1")
    if cfg.retrieval.kind not in ("bm25", "index", "http"):
        problems.append(f"retrieval.kind must be bm25, index or http, got {cfg.retrieval.kind!r}")
    if cfg.retrieval.kind == "http" and not cfg.retrieval.url:
        problems.append("retrieval.kind=http needs retrieval.url")
    if cfg.retrieval.kind == "index" and not cfg.retrieval.index_dir:
        problems.append("retrieval.kind=index needs retrieval.index_dir")
    if training and not cfg.world.enabled and cfg.sft.steps > 0:
        problems.append(f"sft.steps={cfg.sft.steps}: the warm start replays scripted demonstrations of the synthetic "
                        "world; with world.enabled=false set sft.steps=0 (start from an instruction-tuned model)")
    if training and not cfg.world.enabled and not cfg.data.train_path:
        problems.append("data.train_path is required when world.enabled is false")
    if not training and not cfg.world.enabled and not cfg.data.eval_path:
        problems.append("data.eval_path (a directory of evaluation sets) is required when world.enabled is false")
    for key in ("dtype", "param_dtype"):  # checked here too so the message comes before any set-up
        if cfg.model[key] not in DTYPES:
            problems.append(f"model.{key} must be one of {DTYPES}, got {cfg.model[key]!r}")
    if cfg.model.source != "init" and not os.path.isdir(os.path.expanduser(cfg.model.source)):
        problems.append(f"model.source {cfg.model.source!r} is neither 'init' nor a local model directory")
    if problems:
        raise TrainConfigError("invalid training config:\n  - " + "\n  - ".join(problems))
    try:
        agent_config(cfg)
        grpo_config(cfg)
    except (ValueError, TypeError) as e:
        raise TrainConfigError(f"invalid training config: {e}") from e


# ----------------------------------------------------------------------------- setup pieces

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


def build_setup(cfg: ml_collections.ConfigDict, training: bool = True) -> Setup:
    """Tokenizer, prompt builder, retriever and questions. training=False skips the training set."""
    from memsearcher_jax.data.tokenizer import load_tokenizer

    world_paths = None
    if cfg.world.enabled:
        from memsearcher_jax.data.world_cache import prepare_world

        extra = (memsearcher_system_prompt(cfg.agent.default_top_n), react_system_prompt(cfg.agent.default_top_n),
                 MEMORY_UPDATE_INSTRUCTION, COMPACT_SYSTEM_PROMPT, COMPACT_UPDATE_INSTRUCTION)
        world_paths = prepare_world(os.path.expanduser(cfg.world.cache_dir), seed=cfg.world.seed,
                                    num_entities=cfg.world.num_entities, extra_texts=extra,
                                    heldout_by=cfg.world.get("heldout_by", "entity"),
                                    whole_names=cfg.world.get("whole_name_tokens", False),
                                    vocab_dir=reading_vocab_dir(cfg))
    tok_dir = cfg.data.tokenizer_dir or (world_paths.tokenizer_dir if world_paths else cfg.model.source)
    tokenizer = load_tokenizer(tok_dir) if world_paths else _auto_tokenizer(tok_dir)
    builder = PromptBuilder(tokenizer, default_top_n=cfg.agent.default_top_n, style=cfg.agent.prompt_style,
                            stop_ids=stop_token_ids(cfg, tokenizer))
    if world_paths is not None:
        train_q = _read_jsonl(world_paths.train)
        eval_sets = {"synthetic-heldout": _read_jsonl(world_paths.heldout)}
        missing_sets: dict[str, str] = {}
    else:
        from memsearcher_jax.data.qa import evaluation_sets, training_questions

        train_q = training_questions(os.path.expanduser(cfg.data.train_path)) if training else []
        eval_sets, missing_sets = (evaluation_sets(os.path.expanduser(cfg.data.eval_path)) if cfg.data.eval_path
                                   else ({}, {}))
    eval_q = [row for rows in eval_sets.values() for row in rows]
    retriever = build_retriever(cfg, world_paths)
    return Setup(tokenizer=tokenizer, builder=builder, retriever=retriever, train_questions=train_q,
                 eval_questions=eval_q, tokenizer_dir=tok_dir, world=world_paths, eval_sets=eval_sets,
                 missing_eval_sets=missing_sets)


def reading_vocab_dir(cfg: ml_collections.ConfigDict) -> str | None:
    """model.source when it ships a reading vocabulary (the pretrained base does): the synthetic
    world then names its entities from the vocabulary's reserved pool and uses its tokenizer."""
    from memsearcher_jax.data.vocab import ReadingVocab

    source = os.path.expanduser(cfg.model.source)
    return source if cfg.model.source != "init" and ReadingVocab.exists(source) else None


def stop_token_ids(cfg: ml_collections.ConfigDict, tokenizer) -> list[int]:
    """What every generation call stops on besides <|im_end|>: `agent.stop_token_ids` when set,
    else the tokenizer's eos and every eos id of the model directory (model.source)."""
    override = [int(i) for i in cfg.agent.get("stop_token_ids", ())]
    if override:
        return override
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    source = os.path.expanduser(cfg.model.source)
    if cfg.model.source != "init" and os.path.isdir(source):
        ids += eos_token_ids(source)
    return ids


def _auto_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.expanduser(path))


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def build_retriever(cfg: ml_collections.ConfigDict, world_paths=None):
    kind = cfg.retrieval.kind
    if kind == "http":
        from retrieval.client import HTTPRetriever

        return HTTPRetriever(cfg.retrieval.url, api=cfg.retrieval.api)
    if kind == "index":
        from retrieval.loading import load_retriever

        return load_retriever(os.path.expanduser(cfg.retrieval.index_dir))
    from retrieval.bm25 import BM25Retriever

    if world_paths is None:
        raise TrainConfigError("retrieval.kind=bm25 without a saved index needs the synthetic world; "
                               "use retrieval.kind=index with a directory built by `memsearcher-jax index`")
    return BM25Retriever.from_passages(_read_jsonl(world_paths.corpus))


def model_config(cfg: ml_collections.ConfigDict, vocab_size: int, eos_id: int, pad_id: int) -> ModelConfig:
    m = cfg.model
    return ModelConfig.from_preset(
        m.preset, vocab_size=vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
        rope_theta=m.rope_theta, dtype=m.dtype, param_dtype=m.param_dtype, scan_layers=m.scan_layers,
        remat=m.remat, eos_token_id=eos_id, bos_token_id=pad_id)


def load_policy(cfg: ml_collections.ConfigDict, setup: Setup, source: str | None = None) -> Qwen2:
    source = source or cfg.model.source
    if source == "init":
        vocab = -(-len(setup.tokenizer) // 64) * 64  # pad the vocabulary to a multiple of 64
        mc = model_config(cfg, vocab, setup.builder.eos_id, setup.builder.pad_id)
        return Qwen2(mc, rngs=nnx.Rngs(cfg.model.init_seed))
    return from_pretrained(os.path.expanduser(source), dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype,
                           scan_layers=cfg.model.scan_layers, remat=cfg.model.remat)


def batch_for_step(questions: list[dict], step: int, batch: int, seed: int) -> tuple[list[dict], int]:
    """Deterministic data order: a fresh permutation per epoch. Returns (batch, data position)."""
    n = len(questions)
    start = step * batch
    out = []
    for pos in range(start, start + batch):
        epoch, i = divmod(pos, n)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        out.append(questions[perm[i]])
    return out, start + batch


# ----------------------------------------------------------------------------- evaluation

def evaluate(runner: AgentRunner, questions: list[dict], batch: int = 64, seed: int = 0) -> dict:
    """Greedy episodes; EM / F1 / reward means and per-turn context statistics."""
    trajs: list[Trajectory] = []
    for i in range(0, len(questions), batch):
        trajs += runner.run(questions[i:i + batch], group_size=1, seed=seed, first_group_id=i)
    results = score_trajectories(trajs)
    return {
        "em": float(np.mean([r.em for r in results])) if results else 0.0,
        "f1": float(np.mean([r.f1 for r in results])) if results else 0.0,
        "reward": float(np.mean([r.reward for r in results])) if results else 0.0,
        "format_ok": float(np.mean([r.format_ok for r in results])) if results else 0.0,
        "turns": float(np.mean([len(t.context_tokens) for t in trajs])) if trajs else 0.0,
        "trajectories": trajs,
        "results": results,
    }


# ----------------------------------------------------------------------------- the loop

def rollout_metrics(trajs: list[Trajectory], results, rows) -> dict:
    rewards = np.array([r.reward for r in results])
    groups = np.array([t.group_id for t in trajs])
    ctx = [c for t in trajs for c in t.context_tokens]
    mem = [n for t in trajs for n in t.memory_tokens]
    return {
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
        "em": float(np.mean([r.em for r in results])), "f1": float(np.mean([r.f1 for r in results])),
        "format_error_rate": float(np.mean([not r.format_ok for r in results])),
        "zero_variance_groups": float(zero_variance_fraction(rewards, groups)),
        "turns_per_trajectory": float(np.mean([len(t.conversations) for t in trajs])),
        "searches_per_trajectory": float(np.mean([t.num_searches for t in trajs])),
        "memory_tokens_mean": float(np.mean(mem)) if mem else 0.0,
        "context_tokens_mean": float(np.mean(ctx)) if ctx else 0.0,
        "context_tokens_max": float(np.max(ctx)) if ctx else 0.0,
        "response_tokens_mean": float(np.mean([len(c.response_ids) for t in trajs for c in t.conversations])),
        "rows": int(rows.num_rows),
    }


class MetricsWriter:
    """TensorBoard scalars + one JSON line per step."""

    def __init__(self, log_dir: str, resume_step: int = 0):
        """resume_step: the step a resumed run restarts after; lines logged past it by the run
        that died are dropped (TensorBoard purges them too), so every step is logged once."""
        os.makedirs(log_dir, exist_ok=True)
        path = os.path.join(log_dir, "metrics.jsonl")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                kept = [line for line in f if line.endswith("\n") and json.loads(line)["step"] <= resume_step]
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.writelines(kept)
            os.replace(path + ".tmp", path)
        self.jsonl = open(path, "a", encoding="utf-8")
        try:
            from tensorboardX import SummaryWriter

            self.tb = SummaryWriter(log_dir, purge_step=resume_step + 1 if resume_step else None)
        except ImportError:  # TensorBoard is optional
            self.tb = None

    def write(self, step: int, metrics: dict):
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and np.isfinite(v)}
        self.jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self):
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()


class Trainer:
    """Builds the run from a config; `train()` runs (or resumes) it."""

    def __init__(self, cfg: ml_collections.ConfigDict, setup: Setup | None = None, policy: Qwen2 | None = None,
                 progress: bool = True):
        validate(cfg)
        from memsearcher_jax.planner import check_fits

        check_fits(cfg)  # refuse a config that cannot fit its devices, before compiling anything
        self.cfg = cfg
        self.progress = progress
        self.agent_cfg = agent_config(cfg)
        self.grpo_cfg = grpo_config(cfg)
        self.out_dir = os.path.abspath(os.path.expanduser(cfg.train.output_dir))
        os.makedirs(self.out_dir, exist_ok=True)
        self.mesh = None
        n_dev = cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tp
        self.num_hosts = jax.process_count()
        if self.num_hosts > 1:
            if cfg.rl.batch_questions % self.num_hosts:
                raise TrainConfigError(f"rl.batch_questions={cfg.rl.batch_questions} must be a multiple of the "
                                       f"{self.num_hosts} hosts (each rolls out an equal slice)")
            # The learner spans every device of every host; the sampler only this host's.
            self.mesh = distributed.global_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp)
            self.sampler_mesh = distributed.local_mesh(cfg.mesh.tp)
        elif n_dev > 1:
            self.mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp, devices=jax.devices()[:n_dev])
            self.sampler_mesh = self.mesh
        else:
            self.sampler_mesh = None
        self.setup = setup or build_setup(cfg)
        policy = policy if policy is not None else load_policy(cfg, self.setup)
        if self.mesh is not None:
            policy = shard_model(policy, self.mesh, ShardingConfig.training())
        self.learner = GRPOLearner(policy, self.grpo_cfg, mesh=self.mesh)
        self.sampler = build_sampler(cfg, self._sampling_model(), self.sampler_mesh)
        self.runner = AgentRunner(self.setup.builder, self.sampler, self.setup.retriever, self.agent_cfg)
        self.step = 0
        self._ckpt = None

    def _sampling_model(self) -> Qwen2:
        # A model over fresh Variables: re-placing it in the sampling layout must not move the
        # learner's own params out of the training layout.
        model = nnx.merge(self.learner.graphdef, jax.tree.map(lambda x: x, self.learner.params))
        if self.mesh is not None:
            # The tensors that move are moved in the compute dtype (the Sampler casts to it anyway).
            model = shard_model(model, self.mesh, ShardingConfig.sampling(), move_dtype=self.cfg.model.dtype)
        if self.num_hosts > 1:
            # The sampling layout is replicated over data/fsdp and split over tp, which stays
            # inside a host: every host holds a whole copy among its shards. Rebuild it as
            # host-local arrays on the sampler's local mesh (same specs, same devices).
            graphdef, state = nnx.split(model)
            model = nnx.merge(graphdef, distributed.to_local_arrays(state, self.sampler_mesh))
            model.mesh = self.sampler_mesh
            model.sharding = ShardingConfig.sampling()
        return model

    # --- checkpoints ---
    @property
    def checkpoints(self):
        if self._ckpt is None:
            import orbax.checkpoint as ocp

            opts = ocp.CheckpointManagerOptions(max_to_keep=self.cfg.train.keep, enable_async_checkpointing=True)
            self._ckpt = ocp.CheckpointManager(os.path.join(self.out_dir, "checkpoints"), options=opts)
        return self._ckpt

    def save(self, block: bool = False):
        import orbax.checkpoint as ocp

        meta = {"step": self.step, "data_position": self.step * self.cfg.rl.batch_questions,
                "skipped_steps": self.learner.skipped_steps, "seed": self.cfg.train.seed,
                "model_config": dataclasses.asdict(self.learner.model().config),
                "tokenizer_dir": os.path.abspath(self.setup.tokenizer_dir)}
        # Params, optimizer state and metadata are separate items: export restores params alone.
        self.checkpoints.save(self.step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(self.learner.params), opt_state=ocp.args.StandardSave(self.learner.opt_state),
            meta=ocp.args.JsonSave(meta)), force=True)
        if block:
            self.checkpoints.wait_until_finished()

    def maybe_resume(self) -> bool:
        import orbax.checkpoint as ocp

        latest = self.checkpoints.latest_step()
        if latest is None:
            return False
        abstract = lambda tree: jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
        restored = self.checkpoints.restore(latest, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract(self.learner.params)),
            opt_state=ocp.args.StandardRestore(abstract(self.learner.opt_state)), meta=ocp.args.JsonRestore()))
        self.learner.params = restored["params"]
        self.learner.opt_state = restored["opt_state"]
        self.learner.skipped_steps = int(restored["meta"]["skipped_steps"])
        self.step = int(restored["meta"]["step"])
        self.sampler.update_params(self._sampling_model())
        return True

    # --- one step ---
    def train_step(self) -> dict:
        cfg = self.cfg
        t0 = time.perf_counter()
        questions, _ = batch_for_step(self.setup.train_questions, self.step, cfg.rl.batch_questions, cfg.train.seed)
        # This host's contiguous slice (all of it on one host): a group's G samples stay
        # together, so rewards and advantages need nothing from the other hosts.
        first_q = jax.process_index() * (len(questions) // self.num_hosts)
        questions = distributed.host_shard(questions, jax.process_index(), self.num_hosts)
        self.runner.stats = type(self.runner.stats)()
        # Global ids: group ids for the advantages, trajectory ids for the rows and the seeds.
        trajs = self.runner.run(questions, group_size=cfg.rl.group_size, seed=_step_seed(cfg.train.seed, self.step),
                                first_group_id=self.step * cfg.rl.batch_questions + first_q,
                                first_traj_id=first_q * cfg.rl.group_size)
        t_rollout = time.perf_counter() - t0
        results = score_trajectories(trajs)
        adv = trajectory_advantages(trajs, [r.reward for r in results])
        rows = pack_rows(trajs, adv, self.setup.builder.pad_id, min_len=self.grpo_cfg.min_seq_len,
                         max_len=self.grpo_cfg.max_seq_len)
        if self.num_hosts > 1:
            rows = gather_rows(rows, self.setup.builder.pad_id)
        t1 = time.perf_counter()
        rng = np.random.default_rng([cfg.train.seed, self.step, 1])
        update = self.learner.train_on_rows(rows, rng)
        t_update = time.perf_counter() - t1
        self.sampler.update_params(self._sampling_model())
        self.step += 1
        stats = self.runner.stats
        # Multi-host: the rollout metrics (rewards, turns, timings) are this host's trajectories;
        # "rows" and the update's metrics are global.
        metrics = rollout_metrics(trajs, results, rows)
        metrics.update(update)
        metrics.update({
            "skipped_steps_total": self.learner.skipped_steps,
            "time_rollout": t_rollout, "time_sampling": stats.sampler_seconds,
            "time_retrieval": stats.retrieval_seconds, "time_logprobs": update["time_logprobs"],
            "time_update": t_update - update["time_logprobs"],
            "tokens_per_second": stats.generated_tokens / max(stats.sampler_seconds, 1e-9),
        })
        return metrics

    def train(self, steps: int | None = None) -> list[dict]:
        from tqdm.auto import tqdm

        steps = self.cfg.train.steps if steps is None else steps
        self.maybe_resume()
        lead = jax.process_index() == 0  # one host writes the logs and draws the bar
        writer = MetricsWriter(os.path.join(self.out_dir, "logs"), resume_step=self.step) if lead else None
        history = []
        bar = tqdm(total=steps, initial=self.step, desc="GRPO", disable=not (self.progress and lead),
                   dynamic_ncols=True)
        try:
            while self.step < steps:
                m = self.train_step()
                history.append(m)
                if writer is not None:
                    writer.write(self.step, m)
                bar.update(1)
                bar.set_postfix(reward=f"{m['reward_mean']:.3f}", em=f"{m['em']:.2f}", kl=f"{m['approx_kl']:.4f}")
                if self.step % self.cfg.train.save_every == 0 or self.step == steps:
                    self.save()
        finally:
            bar.close()
            if writer is not None:
                writer.close()
            if self._ckpt is not None:
                self.checkpoints.wait_until_finished()
        return history


def gather_rows(rows: RowBatch, pad_id: int) -> RowBatch:
    """Every host's packed rows, in process order, on every host (a collective).

    The sequence length becomes the longest host's bucket, which is the bucket one process
    packing all the trajectories picks (buckets grow with the length); the extra columns are
    padding exactly as pack_rows writes it. So the result equals the single-process RowBatch.
    """
    fields = {f.name: getattr(rows, f.name) for f in dataclasses.fields(RowBatch)}
    return RowBatch(**distributed.allgather_rows(fields, pad_values={"tokens": pad_id}))


def _step_seed(seed: int, step: int) -> int:
    return (seed * 100_003 + step * 9_973 + 17) % (2 ** 31 - 1)
