"""Values read from several keys at once: the objective counts of the training questions and the
demonstrations, and the "auto" flags. Each takes the typed Settings or a ConfigDict with every
key (attribute and key reads only), and refuses a malformed value naming its key."""
from __future__ import annotations

from memsearcher_jax.data.synthetic import parse_objectives_schedule
from memsearcher_jax.settings.fields import flag_value


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


def train_objective_counts(cfg) -> tuple[int, ...]:
    """`world.objectives_mix` ("1,2,3,4") as counts: GRPO's training questions in equal shares at
    each; "" means world.objectives alone. Evaluation asks world.objectives (or --objectives). With
    `world.objectives_schedule` set: every count of its stages (rl/schedule.py runs them by step)."""
    stages = parse_objectives_schedule(cfg.world.objectives_schedule)
    if stages:
        return tuple(sorted({n for _, counts in stages for n in counts}))
    return parse_objective_counts(cfg.world.objectives_mix, "world.objectives_mix", cfg.world.objectives)


def demo_objective_counts(cfg) -> tuple[int, ...]:
    """`sft.demo_objectives` ("1,2") as counts; "" means the training questions' counts."""
    if not str(cfg.sft.demo_objectives).strip():
        return train_objective_counts(cfg)
    return parse_objective_counts(cfg.sft.demo_objectives, "sft.demo_objectives", cfg.world.objectives)


def auto_flag(cfg, section: str, key: str) -> str:
    """A setting that is "auto", True or False (a bool or its spelling), as "auto" / "true" / "false";
    UserInputError naming the key for anything else."""
    return flag_value(cfg[section][key], f"{section}.{key}")


def multi_answer_prompt(cfg) -> bool:
    """Whether the system prompts state the N-answer format (`agent.multi_answer_prompt`): "auto"
    states it when the task asks several questions at once, in the world (world.objectives) or in
    the warm start's demonstrations (sft.demo_objectives); True / False force it."""
    mode = auto_flag(cfg, "agent", "multi_answer_prompt")
    if mode == "auto":
        return max(cfg.world.objectives, *demo_objective_counts(cfg), *train_objective_counts(cfg)) > 1
    return mode == "true"
