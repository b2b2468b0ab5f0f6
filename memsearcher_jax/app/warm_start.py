"""The warm start: supervised training on the scripted demonstrator's episodes, before GRPO.

    inputs = warm_start_inputs(cfg, setup)     # demonstrations -> conversations, tied rows, SFT settings
    model_dir = warm_start(cfg, setup, out_dir, inputs)   # trained and saved as a HF model dir (cached)

The demonstrator (data/demos.py) answers the training questions with deliberate flaws (demo_config);
its conversations, names swapped where `sft.name_swap_rate` asks, are what SFT imitates. The
controls that continue from a warm start (extra_sft here, rft.py) read the same settings.
"""
from __future__ import annotations

import dataclasses
import math
import os

from memsearcher_jax.app.experiment import Setup, demo_config, demo_questions, load_policy
from memsearcher_jax.data.demos import DemoConfig, demo_conversations, demo_stats, make_demonstrations
from memsearcher_jax.data.name_swap import name_swapped_conversations, world_name_table
from memsearcher_jax.data.vocab import ReadingVocab, tied_row_groups
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.models import Qwen2, from_pretrained, save_pretrained
from memsearcher_jax.rl.learner import OptimConfig
from memsearcher_jax.rl.sft import SFTConfig, sft_train
from memsearcher_jax.rules.config_rules import auto_flag
from memsearcher_jax.runtime.console import log
from memsearcher_jax.settings import Settings, SFTSettings


def flawed_demonstrations(cfg: Settings, setup: Setup, seed: int | None = None,
                          config: DemoConfig | None = None) -> list:
    """The scripted demonstrator's episodes on the first `sft.num_demos` training questions (at the
    `sft.demo_objectives` counts), with its deliberate flaws (demo_config; what the warm start imitates)."""
    config = demo_config(cfg) if config is None else config
    return make_demonstrations(demo_questions(cfg, setup), setup.builder, setup.retriever,
                               seed=cfg.train.seed if seed is None else seed, config=config)


def sft_config(cfg: Settings, steps: int, warmup: int | None = None) -> SFTConfig:
    """The supervised trainer's settings from `sft.*` for `steps` steps (warmup: sft.warmup, at most
    `steps`, unless given): the warm start's, and the controls' (extra_sft, rft.py) that continue it."""
    return SFTConfig(steps=steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.learning_rate,
                     warmup=min(cfg.sft.warmup, steps) if warmup is None else warmup, seed=cfg.train.seed,
                     max_len=cfg.agent.max_context_tokens, min_len=cfg.sft.min_len,
                     max_batch_tokens=cfg.sft.max_batch_tokens)


def tie_embedding_rows(cfg: Settings, setup: Setup) -> bool:
    """Whether SFT moves the reading vocabulary's name rows (a group per type) and value rows (a
    group per kind) together, as pretraining did: `sft.tie_embedding_rows`, where "auto" ties on a
    model with a reading vocabulary and not on others (a real checkpoint, a random init); True
    without one is refused. Untied, SFT on demonstrations about training entities moves those names'
    rows alone, and a held-out name (never asked about in training) no longer looks like them
    (docs/lab/2026-11-29-reading-v8-ships.md)."""
    mode = auto_flag(cfg, "sft", "tie_embedding_rows")
    has_vocab = ReadingVocab.exists(setup.tokenizer_dir)
    if mode == "true" and not has_vocab:
        raise UserInputError(f"sft.tie_embedding_rows=True needs a reading vocabulary (reading_vocab.json) in the "
                             f"tokenizer directory {setup.tokenizer_dir}: only a reading base has name and value "
                             "rows to tie; set it to auto or False for other models")
    return mode == "true" or (mode == "auto" and has_vocab)


def embedding_row_groups(cfg: Settings, setup: Setup) -> list[list[int]] | None:
    """The row groups SFT moves together (tied_row_groups) when tie_embedding_rows says so, else None."""
    return tied_row_groups(setup.tokenizer_dir) if tie_embedding_rows(cfg, setup) else None


def name_swap_rate(sft: SFTSettings, setup: Setup) -> float:
    """`sft.name_swap_rate`: the share of demonstrations whose world names are swapped for unused
    names of a reading vocabulary (in [0, 1]: settings.SFTSettings.problems checks it up front).
    Refuses a rate above 0 without a reading vocabulary or a world."""
    rate = sft.name_swap_rate
    if rate and (setup.world is None or not ReadingVocab.exists(setup.tokenizer_dir)):
        raise UserInputError(f"sft.name_swap_rate={rate} swaps the synthetic world's names for unused names of a "
                             f"reading vocabulary; {setup.tokenizer_dir} has no reading_vocab.json or the world is "
                             "off: set it to 0 for other models and data")
    return rate


def warm_start_steps(sft: SFTSettings, rows: int) -> int:
    """`sft.steps`, or with `sft.passes` > 0 the steps that many passes over the `rows` take: equal
    passes are what workflows with one row per episode (react) and one per turn (memsearcher) can share."""
    passes = sft.passes  # >= 0: settings.SFTSettings.problems
    return sft.steps if not passes else max(1, math.ceil(passes * rows / sft.batch_size))


@dataclasses.dataclass(frozen=True)
class WarmStartSettings:
    """The warm start's keys, read and checked once (warm_start_settings), before the demonstrator runs."""
    demo: DemoConfig         # the demonstrator (demo_config)
    name_swap_rate: float    # name_swap_rate
    tie_rows: bool           # tie_embedding_rows


def warm_start_settings(cfg: Settings, setup: Setup) -> WarmStartSettings:
    """The warm start's keys (sft.*) that need the set-up, each read and refused by name once:
    sft.name_swap_rate and sft.tie_embedding_rows against the model's vocabulary and the world,
    then the demonstrator's. Their ranges (and sft.passes) are settings.SFTSettings.problems'."""
    rate, tie_rows = name_swap_rate(cfg.sft, setup), tie_embedding_rows(cfg, setup)
    return WarmStartSettings(demo=demo_config(cfg), name_swap_rate=rate, tie_rows=tie_rows)


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """What the warm start trains on (warm_start_inputs)."""
    demos: int                            # scripted episodes, and their statistics (demo_stats), for the log
    stats: dict
    rows: list                            # their conversations, names swapped where asked
    tied_rows: list[list[int]] | None     # embedding rows SFT moves together (tied_row_groups)
    sft: SFTConfig                        # at the steps the rows take (warm_start_steps)


def warm_start_inputs(cfg: Settings, setup: Setup, demos: list | None = None) -> WarmStart:
    """The warm start's rows and settings: `demos` (default: the demonstrator's episodes on
    demo_questions), `sft.name_swap_rate` of their conversations with the world's names swapped for
    names no question asks about (data/name_swap.py), the tied rows, and SFT's settings. Every key
    is read and refused (warm_start_settings) before the demonstrator runs."""
    s = warm_start_settings(cfg, setup)
    if demos is None:
        demos = flawed_demonstrations(cfg, setup, config=s.demo)
    tied_rows = tied_row_groups(setup.tokenizer_dir) if s.tie_rows else None
    if s.name_swap_rate:
        table = world_name_table(setup.tokenizer_dir, setup.world.world_dir)
        rows = name_swapped_conversations(demos, table, s.name_swap_rate, seed=cfg.train.seed)
    else:
        rows = demo_conversations(demos)
    sft = sft_config(cfg, warm_start_steps(cfg.sft, len(rows)))
    return WarmStart(demos=len(demos), stats=demo_stats(demos), rows=rows, tied_rows=tied_rows, sft=sft)


def warm_start(cfg: Settings, setup: Setup, out_dir: str, inputs: WarmStart | None = None) -> str:
    """Supervised warm start on scripted demonstrations (`inputs`, default: warm_start_inputs);
    cached as a HF model dir in out_dir."""
    if os.path.exists(os.path.join(out_dir, "config.json")):
        log(f"warm start: reusing {out_dir}")
        return out_dir
    inputs = warm_start_inputs(cfg, setup) if inputs is None else inputs
    rows, steps = inputs.rows, inputs.sft.steps
    log(f"warm start: {inputs.demos} scripted demonstrations "
         f"({', '.join(f'{k} {v:.3g}' for k, v in inputs.stats.items())}), "
         f"{steps} SFT steps ({steps * inputs.sft.batch_size / len(rows):.2f} passes over {len(rows)} rows)")
    policy = load_policy(cfg, setup, lora=False)  # SFT trains every weight; GRPO adds adapters after
    policy, history = sft_train(policy, rows, inputs.sft, pad_id=setup.builder.pad_id, tied_rows=inputs.tied_rows)
    log(f"warm start: loss {history[0]['loss']:.3f} -> {history[-1]['loss']:.3f}")
    save_pretrained(policy, out_dir, tokenizer_dir=setup.tokenizer_dir)
    return out_dir


def prepare_warm_start(cfg: Settings, setup: Setup, out: str, fresh: bool) -> WarmStart | None:
    """The warm start's inputs when it will run (sft.steps > 0 and no warm start cached in `out`,
    or --fresh), made before anything is removed: a demonstrator that cannot answer under this
    config fails while the earlier run is still there. None: no warm start to run."""
    cached = os.path.exists(os.path.join(out, "warmstart", "config.json")) and not fresh
    if cfg.sft.steps <= 0 or cached:
        return None
    return warm_start_inputs(cfg, setup)


def continued_sft(cfg: Settings, seed: int) -> tuple[SFTConfig, OptimConfig]:
    """SFT's settings for a control that continues a warm start (extra_sft, rft.py): no step limit
    and no warmup (the clock ends it, not the step count), drawing batches with `seed`, and an
    optimizer at the warm start's final learning rate (where its schedule ended), held constant."""
    sft_cfg = dataclasses.replace(sft_config(cfg, steps=10 ** 9, warmup=0), seed=seed, progress=False)
    optim = OptimConfig(learning_rate=cfg.sft.learning_rate * sft_cfg.final_lr_fraction,
                        weight_decay=sft_cfg.weight_decay, max_grad_norm=sft_cfg.max_grad_norm)
    return sft_cfg, optim


def extra_sft(cfg: Settings, setup: Setup, model_dir: str, seconds: float) -> tuple[Qwen2, int]:
    """The control for GRPO: more supervised training on the same demonstrator's episodes
    (fresh draws of its flaws), starting from `model_dir`, for `seconds` of wall clock at the
    warm start's final learning rate. Returns (model, steps taken)."""
    policy = from_pretrained(model_dir, dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype)
    inputs = warm_start_inputs(cfg, setup, flawed_demonstrations(cfg, setup, seed=cfg.train.seed + 10_000))
    sft_cfg, optim = continued_sft(cfg, seed=cfg.train.seed + 10_000)
    model, history = sft_train(policy, inputs.rows, sft_cfg, setup.builder.pad_id, optim=optim,
                               seconds=seconds, tied_rows=inputs.tied_rows)
    return model, len(history)
