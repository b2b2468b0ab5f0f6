"""A config's checks, in one pass: what the config alone can tell, each problem naming its key.

    s = settings_of(cfg, training)              # an entry point's Settings (a library user's ConfigDict, once)
    problems = config_problems(s, training)     # every problem, in one list (training=False: evaluation)
    validate(s, training)                       # TrainConfigError listing them all; nothing when none
    check_config(s, training)                   # validate, then (training) whether the plan fits its devices

Each section's own rules are its typed settings' `problems()` (memsearcher_jax/settings/), the
rules between sections settings/cross.py's; asked here with what the hosts and the machine tell
(the questions' split over the hosts, the compilation cache, `owners_reading`), the paths the
config reads and writes (machine_rules) and, last, the typed dataclasses' own checks.

Every entry point asks these: a job (validation.check_training, jobs' eval), experiment.build_trainer,
the benches and a library user, so none sees fewer rules than another. The typed readers (a
config's sections -> the dataclasses `agent/` and `rl/` take) live here too: the last rule is that
those dataclasses accept what the config gives them. Above this module, experiment.py builds from a
checked config, and validation.py asks what only the built set-up and the output directory tell.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import ml_collections

from memsearcher_jax.agent.config import AgentConfig
from memsearcher_jax.plan import planner
from memsearcher_jax.plan.memory_estimates import PlanError
from memsearcher_jax.plan.planner import check_fits
from memsearcher_jax.rl.grpo import GRPOConfig
from memsearcher_jax.rl.learner import OptimConfig
from memsearcher_jax.rl.losses import LossConfig
from memsearcher_jax.rl.trainer import LoopConfig
from memsearcher_jax.rules.machine_rules import host_plan_problem, input_path_problems, writable_dir_problem
from memsearcher_jax.runtime import compile_stats
from memsearcher_jax.runtime.distributed import batch_split_problems, staleness_host_problems
from memsearcher_jax.sampling.sampler import check_query_block
from memsearcher_jax.settings import (  # the readers' and rules' old home: their names stay importable here
    SamplerSettings,
    Settings,
    TrainConfigError,
    auto_flag as auto_flag,
    demo_objective_counts as demo_objective_counts,
    info_problems as info_problems,
    load_reward_fn as load_reward_fn,
    multi_answer_prompt as multi_answer_prompt,
    parse_objective_counts as parse_objective_counts,
    schema,
    train_objective_counts as train_objective_counts,
)
from memsearcher_jax.settings.config_utils import missing_keys, schema_problems

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


def typed(cls, s: Settings, **computed):
    """cls(...) with every field not in `computed` read from the key of the same name in its
    settings' sections (SECTIONS_OF[cls]); TrainConfigError naming a field no section has."""
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in computed:
            continue
        section = next((sec for sec in SECTIONS_OF[cls] if f.name in _keys(s[sec])), None)
        if section is None:
            raise TrainConfigError(f"the config has no {' or '.join(f'{sec}.{f.name}' for sec in SECTIONS_OF[cls])} "
                                   f"({cls.__name__}.{f.name}); start from configs/default.py, which has every key")
        values[f.name] = s[section][f.name]
    return cls(**values, **computed)


def _keys(section) -> set[str]:
    return {f.name for f in dataclasses.fields(section)}


def agent_config(s: Settings) -> AgentConfig:
    # Rows per sampler call live with the sampler's settings (the planner reads them there).
    return typed(AgentConfig, s, sampler_batch_size=int(s.sampler.batch_size))


def grpo_config(s: Settings) -> GRPOConfig:
    # The cosine schedule's length: every optimizer step of the run. later_rates belong to
    # pretraining phases (memsearcher_jax/pretrain/), not to GRPO.
    optim = typed(OptimConfig, s, total_steps=s.train.steps * s.rl.optimizer_steps, later_rates=())
    # The learner scores tokens under the distribution the rollouts sampled from. Greedy (0) is refused
    # for training (settings/cross.py); an evaluation config that sets it never trains.
    temperature = s.agent.temperature if s.agent.temperature > 0 else 1.0
    return typed(GRPOConfig, s, loss=typed(LossConfig, s, temperature=temperature), optim=optim)


def output_path(path: str) -> str:
    """A local output path made absolute; a remote one (gs://, s3://) as it is."""
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def loop_config(s: Settings) -> LoopConfig:
    # Weights move to the sampler in the model's compute dtype.
    return typed(LoopConfig, s, output_dir=output_path(s.train.output_dir), sampling_dtype=s.model.dtype)


def prefill_query_block(sampler: SamplerSettings) -> int:
    """sampler.prefill_query_block; TrainConfigError naming the key unless an integer >= 0."""
    try:
        return check_query_block(sampler.prefill_query_block)
    except ValueError as e:
        raise TrainConfigError(f"sampler.{e}") from None


# ----------------------------------------------------------------------------- what the hosts and machine tell

@dataclasses.dataclass(frozen=True)
class OwnersReading:
    """What the job's hosts and this machine make of the keys that depend on them: a problem list
    per key (empty: accepted). The sections' own owners (the sampler's query block, the tool's
    schema, the world's objectives, LoRA) are asked by the sections' `problems()`."""
    batch_split: list[str]    # rl.batch_questions (and rl.max_staleness) over this job's hosts (distributed.py)
    cache_dir: str | None     # the compilation cache's directory (compile_stats), None: not asked or refused
    cache_dir_problems: list[str]


def owners_reading(s: Settings, training: bool = True, files: bool = True) -> OwnersReading:
    """The hosts' split of the questions and the cache directory, each asked once. training=False
    asks nothing of the hosts; files=False nothing of this machine's cache directory."""
    batch_split = (batch_split_problems(s.rl.batch_questions, jax.process_count())
                   if training and s.rl.batch_questions >= 1 else [])
    batch_split += staleness_host_problems(s.rl.max_staleness, jax.process_count()) if training else []
    cache_dir, cache_problems = None, []
    if files and training:
        try:
            cache_dir = compile_stats.resolve_cache_dir(s.train.compilation_cache_dir)
        except ValueError as e:  # a blank directory (it would become a directory named " ")
            cache_problems = [str(e)]
    return OwnersReading(batch_split=batch_split, cache_dir=cache_dir, cache_dir_problems=cache_problems)


# ----------------------------------------------------------------------------- the one pass

def refuse(problems: list[str], what: str = "training config") -> None:
    """TrainConfigError listing `problems` (one line when there is one); nothing when there are none."""
    if len(problems) == 1:
        raise TrainConfigError(f"invalid {what}: {problems[0]}")
    if problems:
        raise TrainConfigError(f"invalid {what}:\n  - " + "\n  - ".join(problems))


def config_problems(cfg: Settings | ml_collections.ConfigDict, training: bool = True,
                    files: bool = True) -> list[str]:
    """Every problem the config alone can tell, each naming its key, in one list: its values (the
    typed settings' rules, settings.Settings.problems, and the split of the questions over the hosts;
    when they are sane, the typed dataclasses' own checks), the files it reads (input_path_problems)
    and, for training, the compilation cache (cache_dir_problems). training=False (evaluation) asks
    for no training data, no groups and no warm start. files=False asks for the values alone, not
    this machine's files: `memsearcher-jax plan` sizes a pod's run on a machine that holds none of
    its data. First of all, its keys: an unknown key, a missing section or a missing key is refused
    on its own (Settings, built at the entry point, have every key: those checks are the file's)."""
    if not isinstance(cfg, Settings):
        if problems := schema_problems(cfg, schema()):
            return problems  # the rules below read every section by name
        if missing := missing_keys(cfg, schema()):
            return [f"the config has no {', '.join(missing[:6])}{' (and more)' if len(missing) > 6 else ''}: a "
                    "config file starts from configs/default.py's get_config(), which has every key, and changes "
                    "what it needs"]
        cfg = Settings.from_config(cfg)
    owners = owners_reading(cfg, training, files)
    problems = (cfg.problems(training) + owners.batch_split) or typed_problems(cfg)
    if files:
        problems += input_path_problems(cfg, training)
        if training:
            problems += cache_dir_problems(cfg.train.compilation_cache_dir, owners)
    return problems


def validate(cfg: Settings | ml_collections.ConfigDict, training: bool = True) -> None:
    """TrainConfigError listing every problem `config_problems` finds (nothing when there are none)."""
    refuse(config_problems(cfg, training), "training config" if training else "evaluation config")


def settings_of(cfg: Settings | ml_collections.ConfigDict, training: bool = True) -> Settings:
    """An entry point's settings, built once: Settings as they are; a library user's ConfigDict with
    each key it leaves out at its default. A key the schema refuses (unknown, or a missing section)
    is a TrainConfigError naming it, as validate words it."""
    if isinstance(cfg, Settings):
        return cfg
    refuse(schema_problems(cfg, schema()), "training config" if training else "evaluation config")
    return Settings.from_config(cfg)


def check_config(s: Settings, training: bool = True) -> None:
    """The one pass over a config before any work: every problem of it, reported together
    (validate); then what needs sane values to be asked: whether training fits its devices
    (planner.check_fits, PlanError with the table; on CPU a warning against the host's memory),
    before anything compiles."""
    validate(s, training)
    if training:
        backend = jax.default_backend()
        if backend == "cpu" and (problem := host_plan_problem(planner.plan_memory(s), backend,
                                                              planner.host_memory_bytes())):
            raise PlanError(problem)
        check_fits(s)


def typed_problems(s: Settings) -> list[str]:
    """The typed dataclasses' own checks (asked once the rest passed: they assume sane values)."""
    try:
        agent_config(s)
        grpo_config(s)
        loop_config(s)
    except (ValueError, TypeError) as e:
        return [str(e)]
    return []


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
