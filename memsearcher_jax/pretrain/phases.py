"""The pretraining phases: `cfg.phases`, a list of dicts in the order they run.

Each phase says everything its steps use:

    name            what the phase is for (logs and error messages)
    start           its first step (the first phase's is 0); it runs until the next phase's start,
                    the last one until train.steps
    max_len         rows longer than this many tokens are drawn again
    batch_size      rows per step
    learning_rate   a constant rate from its start; 0: the rate before it goes on (the run's
                    warm-up + cosine, `train.learning_rate` / `warmup` / `decay_steps` /
                    `final_lr_fraction`, until a phase sets a rate)
    mix             {row kind: weight} over `curriculum.KINDS`; kinds it leaves out are not drawn
    and any of PHASE_SETTINGS (name_copy, long_passages, demo_workflows, ...); one left out is
    `CurriculumConfig`'s default.

Rows depend only on (train.seed, step) and the settings of the phase the step is in, so a config
holding a run's phase list reproduces every step of it from scratch, and a run extended by a phase
after it ended (a phase added at its last step, train.steps raised) keeps every earlier step.
`cfg.curriculum` holds what every phase shares: world_entities, rows_per_world, top_n.
"""
from __future__ import annotations

import dataclasses

import ml_collections

from memsearcher_jax.pretrain.curriculum import CONTEXT_KINDS, KINDS, CurriculumConfig
from memsearcher_jax.rl.learner import OptimConfig

# Curriculum settings a phase may set besides its mix (`CurriculumConfig` fields).
PHASE_SETTINGS = ("name_copy", "cloze_passages", "cloze_questions", "long_passages", "bind_entities", "recall_pairs",
                  "repeat_tokens", "demo_workflows", "demo_objectives")
PHASE_REQUIRED = ("start", "max_len", "batch_size", "mix")
PHASE_KEYS = ("name", *PHASE_REQUIRED, "learning_rate", *PHASE_SETTINGS)
# What cfg.curriculum holds: the settings every phase shares.
SHARED_SETTINGS = ("world_entities", "rows_per_world", "top_n")


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of a run, resolved: steps [start, end), its rows' curriculum (seed, mix, max_len and
    settings), its batch size, and its own constant learning rate (0: the rate before it goes on)."""

    name: str
    start: int
    end: int
    batch_size: int
    learning_rate: float
    curriculum: CurriculumConfig


def _label(i: int, phase) -> str:
    name = phase.get("name") if isinstance(phase, dict) else None
    return f"phases[{i}]" + (f" ({name})" if name else "")


def _phase_entry_problems(i: int, phase, steps: int, begins: int | None) -> list[str]:
    """What is wrong with one entry of cfg.phases (its keys, start, lengths, rate and mix)."""
    where = _label(i, phase)
    if not isinstance(phase, dict):
        return [f"{where} must be a dict with {', '.join(PHASE_REQUIRED)}, got {type(phase).__name__}"]
    problems = []
    unknown = sorted(set(phase) - set(PHASE_KEYS))
    if unknown:
        problems.append(f"{where} sets {unknown}: a phase sets only {', '.join(PHASE_KEYS)}")
    missing = [k for k in PHASE_REQUIRED if k not in phase]
    if missing:
        return problems + [f"{where} needs {', '.join(missing)}"]
    start = phase["start"]
    if begins is None and start != 0:
        problems.append(f"{where}: start must be 0 (the run's first step), got {start}")
    elif begins is not None and not begins < start < steps:
        problems.append(f"{where}: start must be in ({begins}, train.steps={steps}), got {start}")
    for key in ("max_len", "batch_size"):
        if not (isinstance(phase[key], int) and phase[key] >= 1):
            problems.append(f"{where}: {key} must be an integer >= 1, got {phase[key]}")
    rate = phase.get("learning_rate", 0.0)
    if not rate >= 0:
        problems.append(f"{where}: learning_rate must be > 0 (or 0: the rate before it goes on), got {rate}")
    elif begins is None and rate:
        problems.append(f"{where}: learning_rate must be 0: the first phase runs on the warm-up + cosine "
                        f"(train.learning_rate, train.warmup, train.decay_steps), got {rate}")
    mix = phase["mix"]
    if not isinstance(mix, dict) or set(mix) - set(KINDS):
        problems.append(f"{where}: mix must be {{kind: weight}} over {KINDS}, got {mix}")
    return problems


def phase_problems(cfg: ml_collections.ConfigDict) -> list[str]:
    """Every problem of cfg.phases and cfg.curriculum, in order (empty: the list is well formed)."""
    old = sorted(k for k in cfg.keys() if k.endswith("_phase"))
    if old:
        return [f"the config sets {old}: phases are now one list, cfg.phases (see configs/base_v8.py; "
                "memsearcher_jax/pretrain/phases.py says what a phase holds)"]
    problems = []
    shared = cfg.get("curriculum")
    if shared is None or set(shared.keys()) != set(SHARED_SETTINGS):
        got = sorted(shared.keys()) if shared is not None else None
        problems.append(f"curriculum must set exactly {', '.join(SHARED_SETTINGS)} (what every phase shares; "
                        f"a phase's mix and settings go in its entry of phases), got {got}")
    phases = cfg.get("phases")
    if not isinstance(phases, (list, tuple)) or not phases:
        return problems + [f"phases must be a non-empty list of phase dicts, got {phases!r}"]
    begins = None
    for i, phase in enumerate(phases):
        problems += _phase_entry_problems(i, phase, cfg.train.steps, begins)
        if isinstance(phase, dict) and isinstance(phase.get("start"), int):
            begins = phase["start"] if begins is None else max(begins, phase["start"])
    return problems


def _curriculum_config(cfg: ml_collections.ConfigDict, phase: dict) -> CurriculumConfig:
    """A phase's curriculum: the row kinds its mix weighs (in KINDS order), its max_len, its
    PHASE_SETTINGS (each typed as CurriculumConfig's default), and the shared world settings."""
    settings = {}
    for key in PHASE_SETTINGS:
        if key in phase:
            default = getattr(CurriculumConfig, key)  # the field's type, from its default
            settings[key] = tuple(phase[key]) if isinstance(default, tuple) else type(default)(phase[key])
    mix = phase["mix"]
    c = cfg.curriculum
    return CurriculumConfig(seed=cfg.train.seed, mix=tuple((k, mix[k]) for k in KINDS if k in mix),
                            world_entities=c.world_entities, rows_per_world=c.rows_per_world, top_n=c.top_n,
                            max_len=phase["max_len"], **settings)


def phase_list(cfg: ml_collections.ConfigDict) -> list[Phase]:
    """cfg.phases resolved (`Phase`s, in order, tiling steps 0..train.steps). Call on a config
    `phase_problems` passes; a setting CurriculumConfig refuses raises its ValueError."""
    entries = list(cfg.phases)
    ends = [p["start"] for p in entries[1:]] + [cfg.train.steps]
    return [Phase(name=str(p.get("name", "")), start=p["start"], end=end, batch_size=p["batch_size"],
                  learning_rate=float(p.get("learning_rate", 0.0)), curriculum=_curriculum_config(cfg, p))
            for p, end in zip(entries, ends)]


def decay_steps(cfg: ml_collections.ConfigDict) -> int:
    """Where the cosine reaches its floor: train.decay_steps if set (> 0), else train.steps. A run
    extended past its first length keeps its schedule that way (the floor from there on), so a
    from-scratch run of the extended config reproduces every step of it."""
    return cfg.train.get("decay_steps", 0) or cfg.train.steps


def later_rates(cfg: ml_collections.ConfigDict) -> tuple[tuple[int, float], ...]:
    """((start, rate), ...) of every phase with its own constant learning rate."""
    return tuple((p.start, p.learning_rate) for p in phase_list(cfg) if p.learning_rate)


def optim_config(cfg: ml_collections.ConfigDict) -> OptimConfig:
    """The optimizer: AdamW on one warm-up + cosine over the run, then each phase's own constant rate."""
    t = cfg.train
    return OptimConfig(learning_rate=t.learning_rate, b2=0.98, weight_decay=t.weight_decay, schedule="cosine",
                       warmup_steps=min(t.warmup, decay_steps(cfg) - 1), total_steps=decay_steps(cfg),
                       final_lr_fraction=t.final_lr_fraction, later_rates=later_rates(cfg))


def _schedule_text(cfg: ml_collections.ConfigDict) -> str:
    """The learning-rate schedule in words, as the manifest records it."""
    floor_at, rates = decay_steps(cfg), later_rates(cfg)
    floor_held = floor_at < min([at for at, _ in rates] + [cfg.train.steps])   # the floor holds a while
    return (f"cosine to {cfg.train.final_lr_fraction:g} x peak at step {floor_at}"
            + (", constant after" if floor_held else "")
            + "".join(f"; {rate:g} constant from step {at}" for at, rate in rates))


def _curriculum_record(cur: CurriculumConfig) -> dict:
    """A phase's rows as the manifest records them: the mix, and the settings its kinds use."""
    kinds = {k for k, w in cur.mix if w > 0}
    record = {"curriculum": dict(cur.mix)}
    if dict(cur.mix).get("demo", 0) > 0:
        record["demo_episodes"] = {"workflows": list(cur.demo_workflows), "objectives": list(cur.demo_objectives),
                                   "shares": "equal, by episode"}
    if cur.name_copy:
        record["name_copy"] = cur.name_copy
    if kinds & set(CONTEXT_KINDS):
        record["contexts"] = {"cloze_passages": list(cur.cloze_passages), "long_passages": list(cur.long_passages),
                              "bind_entities": list(cur.bind_entities), "questions_per_row": cur.cloze_questions}
    return record


def phase_records(cfg: ml_collections.ConfigDict) -> list[dict]:
    """Every phase as the manifest records it: steps, curriculum mix, max_len, batch size, learning
    rate (one warm-up + cosine schedule runs over all phases; its value where each phase begins and ends)."""
    lr = optim_config(cfg).schedule_fn()
    rows = "one per padded row"
    if cfg.train.pack:
        rows = "packed several to a sequence (the bucket of the step's longest row)"
    schedule = _schedule_text(cfg)
    return [{"steps": f"{p.start}-{p.end}", **_curriculum_record(p.curriculum), "max_len": p.curriculum.max_len,
             "batch_size": p.batch_size, "rows": rows,
             "learning_rate": {"start": round(float(lr(p.start)), 8), "end": round(float(lr(p.end)), 8),
                               "peak": cfg.train.learning_rate, "warmup": cfg.train.warmup,
                               "schedule": schedule}}
            for p in phase_list(cfg)]
