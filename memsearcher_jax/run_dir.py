"""A run's output directory: what a run may write there, and what `--fresh` may remove.

`train` and `pretrain` both resume from their output directory and, with `--fresh`, start over
there. Starting over removes only the entries that kind of run writes, after refusing (before
any work) a directory that holds anything else, the working or home directory, or a file.
"""
from __future__ import annotations

import json
import os
import shutil
import time

from memsearcher_jax.errors import UserInputError

RUN_MARKER = ".memsearcher-run"
# What a training run writes in train.output_dir; `train --fresh` removes these and nothing else.
RUN_ENTRIES = frozenset({RUN_MARKER, "checkpoints", "best", "logs", "warmstart", "lora_base", "summary.json",
                         "learning_curve.png"})
# What a pretraining run writes there (`base`: its export, when train.export_dir is left empty).
PRETRAIN_ENTRIES = frozenset({RUN_MARKER, "checkpoints", "logs", "vocab", "base", "summary.json"})


def is_same_or_parent(path: str, other: str) -> bool:
    """Whether `path` is `other` or one of its parent directories."""
    path, other = os.path.realpath(path), os.path.realpath(other)
    return other == path or other.startswith(path.rstrip(os.sep) + os.sep)


def check_output_dir(out: str, fresh: bool, entries: frozenset = RUN_ENTRIES, kind: str = "training") -> None:
    """Refuse, before any work, an output dir the run cannot write or (fresh) must not clear:
    a file, an unwritable directory, and for --fresh `/`, the home or working directory (or a
    parent of them), a directory holding anything a run of this kind did not write there, and one
    without the marker a run writes first (`RUN_MARKER`)."""
    if "://" in out:  # gs://, s3://: written through etils.epath; nothing local to check
        if fresh:
            raise UserInputError(f"--fresh with the remote train.output_dir={out}: it is never cleared from here; "
                                 "choose a new train.output_dir (or clear it with your storage tools)")
        return
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserInputError(f"train.output_dir={out} is a file, not a directory: choose another train.output_dir")
    parent = out
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserInputError(f"train.output_dir={out}: {parent} is not writable; choose another train.output_dir")
    if not fresh or not os.path.isdir(out):
        return
    for name, where in (("the working directory", os.getcwd()), ("your home directory", os.path.expanduser("~"))):
        if is_same_or_parent(out, where):
            raise UserInputError(f"--fresh with train.output_dir={out}: that is {name} (or holds it); --fresh only "
                                 "clears a run's own directory: give train.output_dir a directory of its own")
    present = set(os.listdir(out))
    foreign = sorted(present - entries)
    if present and not foreign and RUN_MARKER not in present:
        # Entries with a run's names but no marker: a directory of the user's that happens to
        # hold a `logs` or `checkpoints` of their own, or a run from before markers (2026-11-24).
        raise UserInputError(f"--fresh with train.output_dir={out}: it has no {RUN_MARKER} marker, so no "
                             f"memsearcher-jax {kind} run is known to have made it; nothing was removed. If it is "
                             f"an older run's directory, mark it (touch {os.path.join(out, RUN_MARKER)}) and "
                             "run again, or choose another train.output_dir")
    if foreign:
        raise UserInputError(f"--fresh with train.output_dir={out}: it holds {os.path.join(out, foreign[0])}"
                             f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}, which no {kind} run "
                             "wrote; nothing was removed. Move those files or choose another train.output_dir")


def prepare_output_dir(out: str, fresh: bool, entries: frozenset = RUN_ENTRIES, kind: str = "training") -> None:
    """Create the output dir with its marker; fresh: first remove what an earlier run wrote
    there (`entries`), after `check_output_dir` has refused anything else."""
    check_output_dir(out, fresh, entries, kind)
    if "://" in out:
        return
    if fresh and os.path.isdir(out):
        for name in sorted(set(os.listdir(out)) & entries):
            path = os.path.join(out, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    os.makedirs(out, exist_ok=True)
    marker = os.path.join(out, RUN_MARKER)
    if not os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as f:
            json.dump({"written_by": f"memsearcher-jax {'train' if kind == 'training' else 'pretrain'}",
                       "created": time.strftime("%Y-%m-%dT%H:%M:%S")}, f, indent=2)
