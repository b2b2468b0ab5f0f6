"""The rules that read keys of more than one section, in one place (each section's own rules are
its `problems()`). Each takes the typed Settings (`s`; settings/config.py, which asks these) and
returns one message per problem, naming the keys that disagree and what would make them agree."""
from __future__ import annotations

from memsearcher_jax.agent.workflows import get_workflow, workflow_names
from memsearcher_jax.data.synthetic import check_objectives
from memsearcher_jax.settings.readers import demo_objective_counts, train_objective_counts


def cross_section_problems(s, training: bool = True) -> list[str]:
    """Every rule between sections: GRPO's sampling and old log-probs against the agent, sampler and
    model; the data against the world; the objective counts; the warm start against the world and
    the workflow. training=False (evaluation) asks for no training data and no warm start."""
    problems = []
    if training and not s.agent.temperature > 0:
        problems.append(f"agent.temperature={s.agent.temperature}: GRPO samples its groups (greedy episodes "
                        "of one question are all the same); expected > 0 (the recipe's 1.0)")
    if s.rl.old_logprobs == "sampler" and s.sampler.cache_dtype != s.model.dtype:
        # The sampler then scores in another precision than the trainer: its log-probs are not the old policy's.
        problems.append(f"rl.old_logprobs='sampler' needs the sampler to run the trainer's dtype, but "
                        f"sampler.cache_dtype={s.sampler.cache_dtype!r} and model.dtype={s.model.dtype!r}; "
                        "set them equal or rl.old_logprobs='recompute'")
    if s.sampler.devices > 0 and s.sampler.devices % s.mesh.tp:
        problems.append(f"sampler.devices={s.sampler.devices} must be a multiple of mesh.tp={s.mesh.tp}: the sampler "
                        "splits each layer over tp devices as the learner does")
    return problems + data_problems(s, training) + objectives_problems(s) + warm_start_problems(s, training)


def data_problems(s, training: bool = True) -> list[str]:
    """The data a run needs without the synthetic world, and none beside it."""
    problems = []
    if training and not s.world.enabled and not s.data.train_path:
        problems.append("data.train_path is required when world.enabled is false")
    if not training and not s.world.enabled and not s.data.eval_path:
        problems.append("data.eval_path (a directory of evaluation sets) is required when world.enabled is false")
    # The synthetic world supplies every question: a data path beside it was ignored without a word.
    return problems + [f"data.{key}={s.data[key]} is never read: with world.enabled=true (the default) every question "
                       f"comes from the synthetic world; set world.enabled=false to use your data (docs/usage.md, your "
                       f"own model and data), or leave data.{key} empty" for key in ("train_path", "eval_path")
                       if s.world.enabled and s.data[key]]


def objectives_problems(s) -> list[str]:
    """Each count of world.objectives_mix (or the schedule's) and sft.demo_objectives, and above 1
    only on the synthetic world (world.objectives itself: the world section's rule)."""
    try:
        check_objectives(s.world.objectives)
    except ValueError:
        return []  # the world section names it
    try:
        counts, mix = demo_objective_counts(s), train_objective_counts(s)
    except ValueError as e:
        return [str(e)]
    n = s.world.objectives
    if n > 1 and not s.world.enabled:
        return [f"world.objectives={n} joins questions of the synthetic world; with world.enabled=false set "
                "world.objectives=1"]
    if max(mix) > 1 and not s.world.enabled:
        key = "objectives_schedule" if str(s.world.objectives_schedule).strip() else "objectives_mix"
        return [f"world.{key}={s.world[key]!r} joins questions of the synthetic world; with "
                f"world.enabled=false set world.{key}=''"]
    if max(counts) > 1 and not s.world.enabled:
        return [f"sft.demo_objectives={s.sft.demo_objectives!r} joins questions of the synthetic world; with "
                "world.enabled=false set sft.demo_objectives=''"]
    return []


def warm_start_problems(s, training: bool = True) -> list[str]:
    """The warm start replays the synthetic world's demonstrations in the workflow's format."""
    if not training or s.sft.steps <= 0:
        return []
    if not s.world.enabled:
        return [f"sft.steps={s.sft.steps}: the warm start replays scripted demonstrations of the synthetic "
                "world; with world.enabled=false set sft.steps=0 (start from an instruction-tuned model)"]
    workflow = s.agent.workflow
    if workflow in workflow_names() and get_workflow(workflow).recorder is None:
        return [f"agent.workflow={workflow!r} has no recorder, so the warm start (sft.steps={s.sft.steps}) "
                "cannot write the demonstrator's episodes in its format: give the workflow a `recorder` "
                "(agent/workflows/base.py::ScriptRecorder) or set sft.steps=0"]
    return []
