"""What a pretraining run refuses before any work: an invalid config, an export directory it must
not write into, and a resumed run whose vocabulary was built with other settings."""
from __future__ import annotations

import json
import os

import ml_collections

from memsearcher_jax.data.synthetic import WORDINGS
from memsearcher_jax.data.vocab import MANIFEST as VOCAB_MANIFEST
from memsearcher_jax.errors import UserInputError
from memsearcher_jax.pretrain.phases import phase_list, phase_problems
from memsearcher_jax.rules.config_rules import TrainConfigError


def check_base_export_dir(export_dir: str, out: str) -> None:
    """The export may replace files only in the run's own `<output_dir>/base`; any other
    train.export_dir must be new or empty (refused before any work, and again before the export)."""
    if os.path.exists(export_dir) and not os.path.isdir(export_dir):
        raise UserInputError(f"train.export_dir={export_dir} is a file, not a directory: choose another")
    if export_dir == os.path.join(out, "base") or not os.path.isdir(export_dir) or not os.listdir(export_dir):
        return
    held = sorted(os.listdir(export_dir))
    raise UserInputError(f"train.export_dir={export_dir} is not empty (it holds {os.path.join(export_dir, held[0])}"
                         f"{f' and {len(held) - 1} more' if len(held) > 1 else ''}): the export would replace files "
                         "in it. Choose a new or empty directory, or leave train.export_dir empty to export to "
                         f"{os.path.join(out, 'base')}")


def check_vocab_settings(vocab_dir: str, cfg: ml_collections.ConfigDict) -> None:
    """A resumed run keeps the vocabulary its output dir holds: refuse one built with other
    vocab settings than the config's (the names, hence every row, would differ silently)."""
    path = os.path.join(vocab_dir, VOCAB_MANIFEST)
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        built = json.load(f)
    built.setdefault("wording", "v1")  # manifests before wordings were recorded
    wrong = [f"vocab.{k}={cfg.vocab[k]} but {vocab_dir} was built with {k}={built.get(k)}"
             for k in ("seed", "bpe_size", "wording") if k in cfg.vocab and built.get(k) != cfg.vocab[k]]
    if wrong:
        raise UserInputError("; ".join(wrong) + ": resume with the settings it was built with, or start over "
                             "with --fresh (removes that run's checkpoints, logs and vocabulary) or another "
                             "train.output_dir")


def _train_problems(cfg: ml_collections.ConfigDict) -> list[str]:
    t = cfg.train
    problems = [f"train.{key} must be >= 1, got {t[key]}"
                for key in ("steps", "save_every", "probe_every", "probe_items") if t[key] < 1]
    if not (isinstance(t.get("keep_period", 0), int) and t.get("keep_period", 0) >= 0):
        problems.append(f"train.keep_period must be an integer >= 0 (0: keep only the last two checkpoints), "
                        f"got {t.keep_period}")
    if not (isinstance(t.get("data_workers", 0), int) and t.get("data_workers", 0) >= 0):
        problems.append(f"train.data_workers must be an integer >= 0 (0: one thread), got {t.data_workers}")
    if t.learning_rate <= 0:
        problems.append(f"train.learning_rate must be > 0, got {t.learning_rate}")
    if cfg.vocab.get("wording", "v1") not in WORDINGS:
        problems.append(f"vocab.wording must be one of {', '.join(WORDINGS)}, got {cfg.vocab.wording!r}")
    if not 0 <= t.get("decay_steps", 0) <= t.steps:
        problems.append(f"train.decay_steps must be in [0, train.steps={t.steps}] (0: train.steps), "
                        f"got {t.decay_steps}")
    return problems


def _model_problems(m: ml_collections.ConfigDict) -> list[str]:
    problems = []
    if not 0 <= m.get("mimetic_init", 0.0) <= 1:
        problems.append(f"model.mimetic_init must be in [0, 1], got {m.mimetic_init}")
    positional = tuple(m.get("positional_heads", ()))
    if len(positional) > m.num_layers or any(int(d) != d or d < 1 for layer in positional for d in layer):
        problems.append(f"model.positional_heads must be at most num_layers={m.num_layers} tuples of offsets >= 1 "
                        f"(one per layer from layer 0), got {positional}")
    if any(len(layer) > m.num_heads for layer in positional):
        problems.append(f"model.positional_heads names more offsets in a layer than its num_heads={m.num_heads} "
                        f"heads (heads cycle through a layer's offsets), got {positional}")
    if any(positional) and not m.get("positional_strength", 0) > 0:
        problems.append("model.positional_strength must be > 0 with positional_heads, "
                        f"got {m.get('positional_strength')}")
    return problems


def _raise_if(problems: list[str]) -> None:
    if problems:
        raise TrainConfigError("invalid pretraining config:\n  - " + "\n  - ".join(problems))


def validate_pretrain(cfg: ml_collections.ConfigDict) -> None:
    """Every problem of a pretraining config, raised together (`TrainConfigError`) before any work:
    train.*, then model.* and the phase list (`phases.phase_problems`), then what CurriculumConfig
    refuses in a phase's settings (a ValueError naming the field)."""
    _raise_if(_train_problems(cfg))
    _raise_if(_model_problems(cfg.model) + phase_problems(cfg))
    phase_list(cfg)
