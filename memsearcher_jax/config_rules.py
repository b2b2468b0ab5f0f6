"""Every rule of a config, in one place: what the config alone can tell, each problem naming its key.

    problems = config_problems(cfg, training)   # every problem, in one list (training=False: evaluation)
    validate(cfg, training)                     # TrainConfigError listing them all; nothing when none
    check_config(cfg, training)                 # validate, then (training) whether the plan fits its devices

A key a lower module reads at run time keeps its rule there (the sampler's query block, the
tool's schema, the world's objectives, the hosts' split, the cache directory): `owners_reading`
asks every such owner once, first, and each section's rules report its verdict in their place.

What the config asks of this machine (the paths it reads and writes, the plan against the host's
memory) is machine_rules', asked here with the rest; which keys a config may set, config_utils'.

Every entry point asks these: a job (validation.check_training, jobs' eval), experiment.build_trainer,
the benches and a library user, so none sees fewer rules than another. The typed readers (a
config's sections -> the dataclasses `agent/` and `rl/` take) live here too: the last rule is that
those dataclasses accept what the config gives them. Above this module, experiment.py builds from a
checked config, and validation.py asks what only the built set-up and the output directory tell.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
from collections.abc import Callable

import jax
import ml_collections

from memsearcher_jax import compile_stats, planner
from memsearcher_jax.agent.config import AgentConfig
from memsearcher_jax.agent.prompts import HINT_MODES
from memsearcher_jax.agent.tools import tool_spec
from memsearcher_jax.agent.workflows import get_workflow, workflow_names
from memsearcher_jax.config_utils import missing_keys, schema_problems, training_schema
from memsearcher_jax.data.demos import EARLY_SEVERAL, EARLY_TWO_HOP, no_result_note_problem
from memsearcher_jax.data.synthetic import check_objectives, parse_objectives_schedule
from memsearcher_jax.distributed import batch_split_problems
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.machine_rules import host_plan_problem, input_path_problems, writable_dir_problem
from memsearcher_jax.memory_estimates import PlanError, lora_fields
from memsearcher_jax.models.config import DTYPES, LORA_TARGETS
from memsearcher_jax.planner import check_fits
from memsearcher_jax.qa_metrics import compute_reward
from memsearcher_jax.rl.grpo import GRPOConfig
from memsearcher_jax.rl.information import INFO_MODES
from memsearcher_jax.rl.learner import OptimConfig
from memsearcher_jax.rl.losses import LossConfig
from memsearcher_jax.rl.trainer import LoopConfig
from memsearcher_jax.sampling.sampler import check_query_block


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
# Keys of those sections that no dataclass takes: read by name, here or in experiment.py.
KEYS_READ_HERE = {"agent": ("eval_max_turns", "tool", "tool_schema", "stop_token_ids", "multi_answer_prompt", "hint"),
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
    # for training by rl_problems; an evaluation config that sets it never trains.
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
    each; "" means world.objectives alone. Evaluation asks world.objectives (or --objectives). With
    `world.objectives_schedule` set: every count of its stages (rl/schedule.py runs them by step)."""
    stages = parse_objectives_schedule(cfg.world.get("objectives_schedule", ""))
    if stages:
        return tuple(sorted({n for _, counts in stages for n in counts}))
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


# ----------------------------------------------------------------------------- the owners' readings
# (see the module docstring: the rules that live with the module reading the key at run time)

@dataclasses.dataclass(frozen=True)
class OwnersReading:
    """What the module that reads each key at run time makes of it: a problem list per key (empty:
    accepted), and model.lora_* as the trainer reads them."""
    objectives: list[str]     # world.objectives (data/synthetic.py)
    lora: dict                # model.lora_rank / lora_alpha / lora_targets (memory_estimates.lora_fields)
    tool: list[str]           # agent.tool / agent.tool_schema (agent/tools.py)
    query_block: list[str]    # sampler.prefill_query_block (sampling/sampler.py)
    batch_split: list[str]    # rl.batch_questions over this job's hosts (distributed.py)
    cache_dir: str | None     # the compilation cache's directory (compile_stats), None: not asked or refused
    cache_dir_problems: list[str]


def owners_reading(cfg: ml_collections.ConfigDict, training: bool = True, files: bool = True) -> OwnersReading:
    """Every owner asked about its keys, in one place, highest layer first (the data, the plan's
    readers, the agent's tool, the sampler, the hosts, the cache). training=False asks nothing of
    the hosts; files=False nothing of this machine's cache directory."""
    objectives, tool, query_block = [], [], []
    try:
        check_objectives(cfg.world.objectives)
    except ValueError as e:
        objectives = [str(e)]
    lora = lora_fields(cfg)
    try:
        tool_spec(cfg.agent.tool, cfg.agent.get("tool_schema", ""))
    except UserInputError as e:
        tool = [str(e)]
    try:
        check_query_block(cfg.sampler.prefill_query_block)
    except ValueError as e:
        query_block = [f"sampler.{e}"]
    batch_split = (batch_split_problems(cfg.rl.batch_questions, jax.process_count())
                   if training and cfg.rl.batch_questions >= 1 else [])
    cache_dir, cache_problems = None, []
    if files and training:
        try:
            cache_dir = compile_stats.resolve_cache_dir(cfg.train.get("compilation_cache_dir", None))
        except ValueError as e:  # a blank directory (it would become a directory named " ")
            cache_problems = [str(e)]
    return OwnersReading(objectives=objectives, lora=lora, tool=tool, query_block=query_block,
                         batch_split=batch_split, cache_dir=cache_dir, cache_dir_problems=cache_problems)


# ----------------------------------------------------------------------------- the one pass

def refuse(problems: list[str], what: str = "training config") -> None:
    """TrainConfigError listing `problems` (one line when there is one); nothing when there are none."""
    if len(problems) == 1:
        raise TrainConfigError(f"invalid {what}: {problems[0]}")
    if problems:
        raise TrainConfigError(f"invalid {what}:\n  - " + "\n  - ".join(problems))


def config_problems(cfg: ml_collections.ConfigDict, training: bool = True, files: bool = True) -> list[str]:
    """Every problem the config alone can tell, each naming its key, in one list: its values
    (key_problems; when they are sane, the typed dataclasses' own checks), the settings read only
    later (setting_problems), the files it reads (input_path_problems) and, for training, the
    compilation cache (cache_dir_problems). training=False (evaluation) asks for no training data,
    no groups and no warm start. files=False asks for the values alone, not this machine's files:
    `memsearcher-jax plan` sizes a pod's run on a machine that holds none of its data. First of all,
    its keys (training_schema): an unknown key or a missing section is refused on its own."""
    schema = training_schema()
    if schema is not None and (problems := schema_problems(cfg, schema)):
        return problems  # the rules below read every section by name
    try:
        owners = owners_reading(cfg, training, files)
        problems = key_problems(cfg, owners, training) or typed_problems(cfg)
        problems += setting_problems(cfg, owners, training)
        if files:
            problems += input_path_problems(cfg, training)
            if training:
                problems += cache_dir_problems(cfg.train.get("compilation_cache_dir", None), owners)
    except (AttributeError, KeyError):  # a key the config lacks, read by a rule: name what it lacks
        missing = missing_keys(cfg, schema)
        if not missing:
            raise
        return [f"the config has no {', '.join(missing[:6])}{' (and more)' if len(missing) > 6 else ''}: a config "
                "file starts from configs/default.py's get_config(), which has every key, and changes what it needs"]
    return problems


def validate(cfg: ml_collections.ConfigDict, training: bool = True) -> None:
    """TrainConfigError listing every problem `config_problems` finds (nothing when there are none)."""
    refuse(config_problems(cfg, training), "training config" if training else "evaluation config")


def check_config(cfg: ml_collections.ConfigDict, training: bool = True) -> None:
    """The one pass over a config before any work: every problem of it, reported together
    (validate); then what needs sane values to be asked: whether training fits its devices
    (planner.check_fits, PlanError with the table; on CPU a warning against the host's memory),
    before anything compiles."""
    validate(cfg, training)
    if training:
        backend = jax.default_backend()
        if backend == "cpu" and (problem := host_plan_problem(planner.plan_memory(cfg), backend,
                                                              planner.host_memory_bytes())):
            raise PlanError(problem)
        check_fits(cfg)


def key_problems(cfg: ml_collections.ConfigDict, owners: OwnersReading, training: bool = True) -> list[str]:
    """Each key's value and the keys' agreement: cheap checks with messages naming the key (the
    owners' verdicts, `owners`, each in its section's place)."""
    return (rl_problems(cfg, owners, training) + value_problems(cfg) + train_problems(cfg, owners)
            + retrieval_and_data_problems(cfg, training) + objectives_problems(cfg, owners)
            + curriculum_problems(cfg) + sft_problems(cfg, training) + model_problems(cfg, owners))


def typed_problems(cfg: ml_collections.ConfigDict) -> list[str]:
    """The typed dataclasses' own checks (asked once the rest passed: they assume sane values)."""
    try:
        agent_config(cfg)
        grpo_config(cfg)
        loop_config(cfg)
    except (ValueError, TypeError) as e:
        return [str(e)]
    return []


def rl_problems(cfg: ml_collections.ConfigDict, owners: OwnersReading, training: bool = True) -> list[str]:
    """The rl section: batch sizes, groups, the sampling temperature GRPO needs, its reward and
    old log-probs; and, training on several hosts, an equal slice of the questions for each."""
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
    trajectories = cfg.rl.batch_questions * cfg.rl.group_size
    if cfg.rl.optimizer_steps > trajectories >= 1:
        problems.append(f"rl.optimizer_steps={cfg.rl.optimizer_steps} is more than a step's {trajectories} "
                        "trajectories (rl.batch_questions * rl.group_size): some mini-batches would be empty; "
                        f"set rl.optimizer_steps <= {trajectories}")
    problems += owners.batch_split
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
    return problems + info_problems(cfg.rl.get("info_signal", "off"), cfg.rl.get("info_coef", 0.0))


def info_problems(signal, coef) -> list[str]:
    """rl.info_signal and rl.info_coef (rl/information.py): a known mode, a finite coefficient >= 0
    that only "reward" reads, one host (each host would score its own rows in another count of calls)."""
    if signal not in INFO_MODES:
        return [f"rl.info_signal must be one of {', '.join(map(repr, INFO_MODES))}, got {signal!r}"]
    if not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef < 0:
        return [f"rl.info_coef must be a finite number >= 0 (0: the signal shapes nothing), got {coef!r}"]
    if coef and signal != "reward":
        return [f"rl.info_coef={coef} shapes the advantage only with rl.info_signal='reward', got {signal!r}; "
                "set rl.info_signal='reward' or rl.info_coef=0"]
    if signal != "off" and jax.process_count() > 1:
        return [f"rl.info_signal={signal!r} runs on one host only; this job has {jax.process_count()}: set 'off'"]
    return []


def train_problems(cfg: ml_collections.ConfigDict, owners: OwnersReading) -> list[str]:
    """The train section's counts and cadences, and the sampler's prefill block."""
    problems = list(owners.query_block)
    if cfg.train.steps < 0:
        problems.append(f"train.steps must be >= 0, got {cfg.train.steps}")
    if cfg.train.save_every < 1 or cfg.train.keep < 1:
        problems.append("train.save_every and train.keep must be >= 1")
    for key in ("eval_every", "eval_questions", "eval_per_set", "log_samples_every"):
        if cfg.train[key] < 0:
            problems.append(f"train.{key} must be >= 0, got {cfg.train[key]}")
    return problems


def retrieval_and_data_problems(cfg: ml_collections.ConfigDict, training: bool = True) -> list[str]:
    """The retriever the config names, and the data it needs without the synthetic world."""
    problems = []
    if cfg.retrieval.kind not in ("bm25", "index", "http"):
        problems.append(f"retrieval.kind must be bm25, index or http, got {cfg.retrieval.kind!r}")
    if cfg.retrieval.kind == "http" and not cfg.retrieval.url:
        problems.append("retrieval.kind=http needs retrieval.url")
    if cfg.retrieval.kind == "index" and not cfg.retrieval.index_dir:
        problems.append("retrieval.kind=index needs retrieval.index_dir")
    if training and not cfg.world.enabled and not cfg.data.train_path:
        problems.append("data.train_path is required when world.enabled is false")
    if not training and not cfg.world.enabled and not cfg.data.eval_path:
        problems.append("data.eval_path (a directory of evaluation sets) is required when world.enabled is false")
    # The synthetic world supplies every question: a data path beside it was ignored without a word.
    problems += [f"data.{key}={cfg.data[key]} is never read: with world.enabled=true (the default) every question "
                 f"comes from the synthetic world; set world.enabled=false to use your data (docs/usage.md, your "
                 f"own model and data), or leave data.{key} empty" for key in ("train_path", "eval_path")
                 if cfg.world.enabled and cfg.data[key]]
    return problems


def sft_problems(cfg: ml_collections.ConfigDict, training: bool = True) -> list[str]:
    """The warm start's values read with the rest (setting_problems asks those read only later)."""
    problems = []
    if cfg.sft.get("early_two_hop", "first_hop") not in EARLY_TWO_HOP:
        problems.append(f"sft.early_two_hop must be one of {', '.join(EARLY_TWO_HOP)}, got {cfg.sft.early_two_hop!r}")
    if cfg.sft.get("early_several", "first_hop") not in EARLY_SEVERAL:
        problems.append(f"sft.early_several must be one of {', '.join(EARLY_SEVERAL)}, got {cfg.sft.early_several!r}")
    if "no_result_note" in cfg.sft and (why := no_result_note_problem(cfg.sft.no_result_note)):
        problems.append(why)
    if cfg.sft.get("max_batch_tokens", 0) < 0:
        problems.append(f"sft.max_batch_tokens={cfg.sft.max_batch_tokens}: padded slots per SFT micro-batch, "
                        "expected >= 0 (0: no split)")
    if training:
        problems += sft_count_problems(cfg)
    if training and not cfg.world.enabled and cfg.sft.steps > 0:
        problems.append(f"sft.steps={cfg.sft.steps}: the warm start replays scripted demonstrations of the synthetic "
                        "world; with world.enabled=false set sft.steps=0 (start from an instruction-tuned model)")
    workflow = cfg.agent.workflow
    if (training and cfg.world.enabled and cfg.sft.steps > 0 and workflow in workflow_names()
            and get_workflow(workflow).recorder is None):
        problems.append(f"agent.workflow={workflow!r} has no recorder, so the warm start (sft.steps={cfg.sft.steps}) "
                        "cannot write the demonstrator's episodes in its format: give the workflow a `recorder` "
                        "(agent/workflows/base.py::ScriptRecorder) or set sft.steps=0")
    return problems


# The warm start's counts and their least values (SFTConfig's and the demonstrator's; sft.steps=-5
# ran with no warm start and exit 0, the others ended in a ValueError once the warm start began).
SFT_COUNTS = {"steps": 0, "batch_size": 1, "warmup": 0, "min_len": 2, "num_demos": 1}
SFT_FLAWS = ("vague_query_rate", "wrong_answer_rate", "early_answer_rate")  # at most one flaw a demonstration


def sft_count_problems(cfg: ml_collections.ConfigDict) -> list[str]:
    """The warm start's counts, learning rate and shares of the demonstrations (its flaws, which
    share the demonstrations and so sum to <= 1; the two-hop and ReAct shares), each named."""
    s = cfg.sft
    problems = [f"sft.{key} must be >= {low}{' (0: no warm start)' if key == 'steps' else ''}, got {s[key]}"
                for key, low in SFT_COUNTS.items() if s[key] < low]
    if not s.learning_rate > 0:
        problems.append(f"sft.learning_rate must be > 0, got {s.learning_rate}")
    shares = [k for k in (*SFT_FLAWS, "two_hop_early_rate", "react_share") if k in s]
    problems += [f"sft.{k}={s[k]}: a share of the demonstrations, expected in [0, 1]" for k in shares
                 if not 0 <= s[k] <= 1]
    flaws = sum(s.get(k, 0.0) for k in SFT_FLAWS)
    if flaws > 1 + 1e-9 and all(0 <= s.get(k, 0.0) <= 1 for k in SFT_FLAWS):
        problems.append(f"{' + '.join(f'sft.{k}' for k in SFT_FLAWS)} = {flaws:.3g}: a demonstration has at most one "
                        "flaw, so the shares must sum to <= 1")
    return problems


def model_problems(cfg: ml_collections.ConfigDict, owners: OwnersReading) -> list[str]:
    """The model section's values: dtypes and LoRA settings (that its source exists: input_path_problems)."""
    problems = []
    for key in ("dtype", "param_dtype"):  # checked here too so the message comes before any set-up
        if cfg.model[key] not in DTYPES:
            problems.append(f"model.{key} must be one of {DTYPES}, got {cfg.model[key]!r}")
    lora = owners.lora
    if lora["lora_rank"] < 0:
        problems.append(f"model.lora_rank must be >= 0 (0 = full fine-tuning), got {lora['lora_rank']}")
    elif lora["lora_rank"] > 0:
        bad = [t for t in lora["lora_targets"] if t not in LORA_TARGETS]
        if bad or not lora["lora_targets"]:
            problems.append(f"model.lora_targets must name some of {', '.join(LORA_TARGETS)}, got "
                            f"{cfg.model.lora_targets!r}")
        if not lora["lora_alpha"] > 0:
            problems.append(f"model.lora_alpha must be > 0, got {lora['lora_alpha']}")
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


def objectives_problems(cfg: ml_collections.ConfigDict, owners: OwnersReading) -> list[str]:
    """world.objectives: an integer >= 1, and above 1 only on the synthetic world; each count of
    world.objectives_mix and sft.demo_objectives likewise."""
    n = cfg.world.objectives
    if owners.objectives:
        return owners.objectives
    try:
        counts = demo_objective_counts(cfg)
        mix = train_objective_counts(cfg)
    except ValueError as e:
        return [str(e)]
    if n > 1 and not cfg.world.enabled:
        return [f"world.objectives={n} joins questions of the synthetic world; with world.enabled=false set "
                "world.objectives=1"]
    if max(mix) > 1 and not cfg.world.enabled:
        key = "objectives_schedule" if str(cfg.world.get("objectives_schedule", "")).strip() else "objectives_mix"
        return [f"world.{key}={cfg.world[key]!r} joins questions of the synthetic world; with "
                f"world.enabled=false set world.{key}=''"]
    if max(counts) > 1 and not cfg.world.enabled:
        return [f"sft.demo_objectives={cfg.sft.demo_objectives!r} joins questions of the synthetic world; with "
                "world.enabled=false set sft.demo_objectives=''"]
    return []


def curriculum_problems(cfg: ml_collections.ConfigDict) -> list[str]:
    """Issue 83's keys: world.objectives_schedule beside world.objectives_mix (its syntax is
    objectives_problems', through train_objective_counts), its advance threshold and window; agent.hint."""
    w, problems = cfg.world, []
    schedule, advance, window = (str(w.get("objectives_schedule", "")).strip(), w.get("schedule_advance_em", 0.0),
                                 w.get("schedule_window", 5))
    if schedule and str(w.get("objectives_mix", "")).strip():
        problems.append(f"world.objectives_schedule={schedule!r} sets GRPO's question counts step by step, and "
                        f"world.objectives_mix={w.objectives_mix!r} sets them for every step; set "
                        "world.objectives_mix=''")
    if not 0 <= advance <= 1:
        problems.append(f"world.schedule_advance_em={advance}: a training EM in [0, 1] that ends a stage early "
                        "(0: off)")
    elif advance > 0 and not schedule:
        problems.append(f"world.schedule_advance_em={advance} ends a stage of world.objectives_schedule early, which "
                        "is '': set a schedule or world.schedule_advance_em=0")
    if window < 1:
        problems.append(f"world.schedule_window={window}: the steps whose mean EM world.schedule_advance_em reads, "
                        "expected >= 1")
    if cfg.agent.get("hint", "none") not in HINT_MODES:
        problems.append(f"agent.hint={cfg.agent.hint!r}: expected one of {', '.join(map(repr, HINT_MODES))}")
    return problems


def setting_problems(cfg: ml_collections.ConfigDict, owners: OwnersReading, training: bool = True) -> list[str]:
    """Settings read only once the world is built (the search tool, the prompt's answer format) or
    the warm start runs (its length in passes, its name swaps, its tied rows), asked up front:
    agent.tool / agent.tool_schema, agent.multi_answer_prompt, sft.passes, sft.name_swap_rate and
    sft.tie_embedding_rows. Evaluation (training=False) runs no warm start."""
    checks = [lambda: auto_flag(cfg, "agent", "multi_answer_prompt")]
    checks += [lambda: auto_flag(cfg, "sft", "tie_embedding_rows")] if training else []
    problems = list(owners.tool)
    for check in checks:
        try:
            check()
        except UserInputError as e:
            problems.append(str(e))
    if not training:
        return problems
    passes, rate = cfg.sft.get("passes", 0.0), cfg.sft.get("name_swap_rate", 0.0)
    if passes < 0:
        problems.append(f"sft.passes={passes}: passes over the warm start's rows, expected >= 0 (0: use sft.steps)")
    if not 0 <= rate <= 1:
        problems.append(f"sft.name_swap_rate={rate}: a share of the demonstrations, expected in [0, 1]")
    return problems


def cache_dir_problems(configured: str | None, owners: OwnersReading) -> list[str]:
    """The persistent compilation cache (train.compilation_cache_dir, or the environment's
    override; `owners.cache_dir` as compile_stats resolves it) must be a directory the job can
    make and write: a file there, or under it, was a FileExistsError / NotADirectoryError traceback."""
    if owners.cache_dir_problems:
        return owners.cache_dir_problems
    path = owners.cache_dir
    if not path:
        return []
    env = os.environ.get(compile_stats.CACHE_DIR_ENV)
    named = (f"${compile_stats.CACHE_DIR_ENV}={env}" if env is not None
             else f"train.compilation_cache_dir={configured if configured is not None else path}")
    fix = (f"point {'it' if env is not None else 'train.compilation_cache_dir'} at a directory, or set it to '' "
           "for no cache")
    problem = writable_dir_problem(path, named, fix)
    return [problem] if problem else []
