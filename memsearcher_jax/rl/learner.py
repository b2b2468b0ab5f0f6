"""What every learner here shares (pretraining, SFT, GRPO): the optimizer, one update that skips
non-finite gradients, and jitted steps over split, donated parameters. A LoRA model
(config.lora_rank > 0) splits into its adapters, which train, and the frozen base, which
the steps take as a separate argument that is neither updated nor donated.

    tx = make_optimizer(OptimConfig(learning_rate=1e-3, schedule="cosine", warmup_steps=20, total_steps=800))
    params, opt_state, grad_norm, skipped = apply_update(params, opt_state, grads, tx)
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from memsearcher_jax.models.qwen2 import LoRAParam

SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW after global-norm clipping. Defaults are the GRPO recipe's (docs/method.md §2):
    lr 1e-6 constant, no warm-up. schedule="cosine" decays from the peak (after a linear
    warm-up) to learning_rate * final_lr_fraction at total_steps."""

    learning_rate: float = 1e-6
    b1: float = 0.9
    b2: float = 0.999
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 0          # the cosine's length (ignored by "constant")
    final_lr_fraction: float = 0.1
    # ((step, rate), ...): from each step on, a constant rate instead of the schedule above (a
    # pretraining phase added after a run's cosine ended, at a rate of its own).
    later_rates: tuple[tuple[int, float], ...] = ()

    def __post_init__(self):
        problems = []
        if not self.learning_rate > 0:
            problems.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.warmup_steps < 0:
            problems.append(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.schedule == "cosine" and self.total_steps <= self.warmup_steps:
            problems.append(f"a cosine schedule needs total_steps > warmup_steps, got {self.total_steps} "
                            f"and {self.warmup_steps}")
        if not 0 <= self.final_lr_fraction <= 1:
            problems.append(f"final_lr_fraction must be in [0, 1], got {self.final_lr_fraction}")
        if not self.max_grad_norm > 0:
            problems.append(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        starts = [s for s, _ in self.later_rates]
        if starts != sorted(set(starts)) or any(s <= 0 for s in starts) or any(not r > 0 for _, r in self.later_rates):
            problems.append("later_rates must be (step > 0, rate > 0) pairs with increasing steps, "
                            f"got {self.later_rates}")
        if problems:
            raise ValueError("invalid OptimConfig: " + "; ".join(problems))

    def schedule_fn(self) -> optax.Schedule:
        base = self._base_schedule()
        if not self.later_rates:
            return base
        return optax.join_schedules([base, *(optax.constant_schedule(r) for _, r in self.later_rates)],
                                    [s for s, _ in self.later_rates])

    def _base_schedule(self) -> optax.Schedule:
        lr, warm = self.learning_rate, self.warmup_steps
        if self.schedule == "cosine":
            return optax.warmup_cosine_decay_schedule(0.0 if warm else lr, lr, warm, self.total_steps,
                                                      lr * self.final_lr_fraction)
        if warm:
            return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), optax.constant_schedule(lr)], [warm])
        return optax.constant_schedule(lr)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on the config's schedule."""
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                       optax.adamw(cfg.schedule_fn(), b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay))


def apply_update(params, opt_state, grads, tx: optax.GradientTransformation,
                 transform_updates: Callable | None = None):
    """One optimizer step -> (params, opt_state, grad_norm, skipped). A step whose gradients are
    not all finite leaves params and optimizer state unchanged (skipped = True).
    transform_updates: applied to the updates before they are added (e.g. `tie_row_updates`)."""
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(grad_norm)
    safe = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)
    updates, new_opt = tx.update(safe, opt_state, params)
    if transform_updates is not None:
        updates = transform_updates(updates)
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    return keep(new_params, params), keep(new_opt, opt_state), grad_norm, jnp.logical_not(finite)


def tie_row_updates(updates, row_group: jax.Array, num_groups: int):
    """Embedding rows of one group move together: each gets its group's mean update (weight
    decay included), so the differences between them stay what they were at initialisation.
    row_group: int [V], the group of each token row, -1 for rows updated on their own."""
    grouped = row_group >= 0
    gid = jnp.where(grouped, row_group, num_groups)  # ungrouped rows go to a spare segment

    def tie(path, u):
        if not (path and getattr(path[0], "key", None) == "embed"):
            return u
        sums = jax.ops.segment_sum(u, gid, num_segments=num_groups + 1)
        counts = jax.ops.segment_sum(jnp.ones_like(gid, u.dtype), gid, num_segments=num_groups + 1)
        mean = sums / jnp.maximum(counts, 1)[:, None]
        return jnp.where(grouped[:, None], mean[gid], u)

    return jax.tree_util.tree_map_with_path(tie, updates)


def merge_params(graphdef, params, frozen=None):
    """The module from its trainable params and, for a LoRA model, its frozen base."""
    return nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen)


class Learner:
    """Split parameters, optimizer state, and the one pattern for jitted steps: parameters are
    arguments (new weights never recompile) and the step's (params, opt_state) are donated
    (updated in place, never held twice).

    Full fine-tuning: `params` is every nnx.Param and `frozen` is None. LoRA: `params` holds
    the adapters only (the optimizer state covers them alone) and `frozen` the base weights."""

    def __init__(self, model, tx: optax.GradientTransformation):
        if getattr(model.config, "lora", False):
            self.graphdef, self.params, self.frozen = nnx.split(model, LoRAParam, nnx.Param)
        else:
            self.graphdef, self.params = nnx.split(model, nnx.Param)
            self.frozen = None
        self.tx = tx
        self.opt_state = tx.init(self.params)

    def model(self):
        return merge_params(self.graphdef, self.params, self.frozen)

    @staticmethod
    def donating_jit(step: Callable) -> Callable:
        """jit a step(params, opt_state, *batch) whose first two arguments it returns updated."""
        return jax.jit(step, donate_argnums=(0, 1))

