"""A run's output directory: what a run may write there, and what `--fresh` may remove.

`train` and `pretrain` both resume from their output directory and, with `--fresh`, start over
there. Before any work a run refuses: an output dir that is a file or blank; a non-empty one that
no run of its kind marked (`RUN_MARKER`) -- a directory of the user's; one another process is
running in (`RUN_LOCK`); and for --fresh the working or home directory, or a directory holding
anything a run of that kind did not write, at the top or inside its own entries (logs/,
checkpoints/, warmstart/, ...). Starting over then removes those entries by name and nothing else.
`eval --out` has a marker of its own (`EVAL_MARKER`): it rewrites only a directory it wrote.

What a run writes there is named once, below (the entries, and what may lie inside each): the
code that writes an entry takes its name from here (rl/, below the jobs, names its own: read here),
and `--fresh` removes exactly these. Every file a run, `eval --out` or a bench rewrites goes
through `replaced`: a new file beside it, renamed over it, so a symlink in its place is replaced
and the file it points at is never written.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import time

from memsearcher_jax.errors import UserInputError
from memsearcher_jax.models.hf_io import TOKENIZER_FILES, is_model_file
from memsearcher_jax.rl.checkpoints import BEST_DIR, CHECKPOINTS_DIR, STEP_ITEMS
from memsearcher_jax.rl.metrics import LOG_DIR, is_log_file
from memsearcher_jax.settings import Settings

# ----------------------------------------------------------------------------- what a run writes, by name

RUN_MARKER = ".memsearcher-run"
# Held (fcntl.flock) by the process running in the directory, for the run's life; holds its pid.
RUN_LOCK = ".memsearcher-run.lock"
STAGING_PREFIX = ".tmp-export-"  # hf_io's staging dirs beside warmstart/, lora_base/, base/ (a killed export's)
WRITE_PREFIX = ".tmp-write-"  # `replaced`'s new files (one a kill left behind: the writer's, --fresh removes it)
WARMSTART_DIR = "warmstart"  # the warm start's model (warm_start.py), GRPO's starting point
LORA_BASE_DIR = "lora_base"  # a LoRA run's frozen base, when it has no other directory (experiment.py)
VOCAB_DIR = "vocab"  # a pretraining run's tokenizer and reading vocabulary
BASE_DIR = "base"  # a pretraining run's export, when train.export_dir is left empty
SUMMARY = "summary.json"
CURVE = "learning_curve.png"
RUN_CONFIG = os.path.join(LOG_DIR, "run_config.json")  # the config a training run records (record_config)
# What a training run writes in train.output_dir; `train --fresh` removes these and nothing else.
RUN_ENTRIES = frozenset({RUN_MARKER, RUN_LOCK, CHECKPOINTS_DIR, BEST_DIR, LOG_DIR, WARMSTART_DIR, LORA_BASE_DIR,
                         SUMMARY, CURVE})
# What a pretraining run writes there.
PRETRAIN_ENTRIES = frozenset({RUN_MARKER, RUN_LOCK, CHECKPOINTS_DIR, LOG_DIR, VOCAB_DIR, BASE_DIR, SUMMARY})
_FILE_ENTRIES = (RUN_MARKER, RUN_LOCK, SUMMARY, CURVE)  # the entries that are files, not directories
# `eval --out`: its marker and the two files it writes.
EVAL_MARKER = ".memsearcher-eval"
EVAL_FILES = ("results.json", "trajectories.jsonl")

_STEP = re.compile(r"\d+(\.orbax-checkpoint-tmp-\d+)?$")  # checkpoints/<step>, or one orbax is writing


@contextlib.contextmanager
def replaced(path: str):
    """The path of a new, empty file beside `path` (its name ends as `path`'s does: a plot's format
    follows it) to write; when the block ends it is renamed over `path` (os.replace: a symlink
    there is replaced, never written through, and a reader sees the old file or the new one,
    whole); if the block raises, it is removed and `path` is left as it was."""
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f"{WRITE_PREFIX}{secrets.token_hex(4)}-{name}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # O_EXCL: a new file, never a link's target
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_text(path: str, text: str) -> None:
    """`text` as `path`'s contents, through `replaced` (a symlink at `path` is replaced, not followed)."""
    with replaced(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(path: str, obj, indent: int = 2, **dump) -> None:
    """`obj` as JSON in `path`, through `replaced`."""
    write_text(path, json.dumps(obj, indent=indent, **dump))


def existing_parent(path: str) -> str:
    """`path` if it exists, else its nearest ancestor that does (a file there: nothing can be made under it)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def is_same_or_parent(path: str, other: str) -> bool:
    """Whether `path` is `other` or one of its parent directories."""
    path, other = os.path.realpath(path), os.path.realpath(other)
    return other == path or other.startswith(path.rstrip(os.sep) + os.sep)


def output_dir_path(value: str, key: str = "train.output_dir") -> str:
    """`value` made absolute (a remote gs://, s3:// path as it is); a blank value is refused: an
    empty path would be the working directory."""
    if not str(value).strip():
        raise UserInputError(f"{key}={value!r} is blank: give the run a directory of its own (e.g. runs/default)")
    return value if "://" in value else os.path.abspath(os.path.expanduser(value))


def check_cache_dir(configured: str | None) -> None:
    """The persistent compilation cache's directory (compile_stats.resolve_cache_dir): a blank
    one is refused before any work (it would become a directory named " ")."""
    from memsearcher_jax.runtime.compile_stats import resolve_cache_dir

    try:
        resolve_cache_dir(configured)
    except ValueError as e:
        raise UserInputError(str(e)) from None


def marker_kind(out: str) -> str | None:
    """The command named by the run marker in `out` ("train", "pretrain"), None when the marker
    names none (a marker a user made by hand, `touch`)."""
    try:
        with open(os.path.join(out, RUN_MARKER), encoding="utf-8") as f:
            written_by = json.load(f).get("written_by", "")
    except (OSError, ValueError, AttributeError):
        return None
    return written_by.split()[-1] if written_by.startswith("memsearcher-jax ") else None


def _allowed_inside(entry: str, name: str, is_dir: bool) -> bool:
    """Whether `entry/name` is something a run writes there (logs, checkpoint steps, model files)."""
    if entry in (CHECKPOINTS_DIR, BEST_DIR):
        return is_dir and bool(_STEP.match(name))
    if entry == LOG_DIR:
        return (is_log_file(name) or name == os.path.basename(RUN_CONFIG)
                or (not is_dir and name.startswith(WRITE_PREFIX)))
    if entry == VOCAB_DIR:
        return not is_dir and name in TOKENIZER_FILES
    if entry in (WARMSTART_DIR, LORA_BASE_DIR, BASE_DIR):
        return not is_dir and (is_model_file(name) or name == "base_manifest.json")
    return False


def _killed_write(path: str) -> bool:
    """A file `replaced` made and a kill left behind (its writer's, like the file it was to become)."""
    return os.path.basename(path).startswith(WRITE_PREFIX) and os.path.isfile(path) and not os.path.islink(path)


def foreign_entries(out: str, entries: frozenset = RUN_ENTRIES) -> list[str]:
    """Paths in `out` that no run with these `entries` wrote: at the top, inside its directories
    (logs/, checkpoints/, warmstart/, ...) and inside each checkpoint step (its items and orbax's
    own `_`-named and commit files)."""
    found = []
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if (name.startswith(STAGING_PREFIX) and os.path.isdir(path)) or _killed_write(path):
            continue
        if name not in entries:
            found.append(path)
        elif os.path.isdir(path) and not os.path.islink(path):
            for inner in sorted(os.listdir(path)):
                inner_path = os.path.join(path, inner)
                if not _allowed_inside(name, inner, os.path.isdir(inner_path)):
                    found.append(inner_path)
                elif name in (CHECKPOINTS_DIR, BEST_DIR):
                    found += [os.path.join(inner_path, item) for item in sorted(os.listdir(inner_path))
                              if not (item.split(".")[0] in STEP_ITEMS or item.startswith("_")
                                      or item == "commit_success.txt")]
        elif name in _FILE_ENTRIES and os.path.isdir(path):
            found.append(path)
    return found


def _refuse_unmarked(out: str, kind: str, fresh: bool) -> None:
    """A non-empty directory without a run marker of this kind is not this kind of run's: refused."""
    # The user's own files first in the message: they are what makes the directory theirs.
    present = sorted(os.listdir(out), key=lambda n: (n in RUN_ENTRIES | PRETRAIN_ENTRIES, n))
    mine = "train" if kind == "training" else "pretrain"
    marked = marker_kind(out) if RUN_MARKER in present else "absent"
    what = "--fresh with " if fresh else ""
    if marked == "absent" and present:
        # A run from before markers has checkpoints; a summary and a plot alone may well be the user's.
        older = set(present) <= RUN_ENTRIES | PRETRAIN_ENTRIES and os.path.isdir(os.path.join(out, CHECKPOINTS_DIR))
        raise UserInputError(f"{what}train.output_dir={out} is not empty (it holds {os.path.join(out, present[0])}"
                             f"{f' and {len(present) - 1} more' if len(present) > 1 else ''}) and has no "
                             f"{RUN_MARKER} marker, so no memsearcher-jax {kind} run made it; nothing was removed "
                             "or written. Choose a new or empty train.output_dir"
                             + (f", or, if it is an older run's directory (from before 2026-11-24), mark it (touch "
                                f"{os.path.join(out, RUN_MARKER)}) and run again" if older else ""))
    if marked not in ("absent", None, mine):
        raise UserInputError(f"{what}train.output_dir={out} is the directory of a `memsearcher-jax {marked}` run, "
                             f"not of a {kind} run; nothing was removed or written: choose another train.output_dir")


def check_output_dir(out: str, fresh: bool, entries: frozenset = RUN_ENTRIES, kind: str = "training") -> None:
    """Refuse, before any work, an output dir the run must not write in or (fresh) clear: a file,
    an unwritable directory, a non-empty directory no run of this kind marked (`RUN_MARKER`);
    for --fresh also `/`, the home or working directory (or a parent of them) and a directory
    holding anything a run of this kind did not write there (`foreign_entries`)."""
    if "://" in out:  # gs://, s3://: written through etils.epath; nothing local to check
        if fresh:
            raise UserInputError(f"--fresh with the remote train.output_dir={out}: it is never cleared from here; "
                                 "choose a new train.output_dir (or clear it with your storage tools)")
        return
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserInputError(f"train.output_dir={out} is a file, not a directory: choose another train.output_dir")
    parent = existing_parent(out)
    if not os.path.isdir(parent):
        raise UserInputError(f"train.output_dir={out}: {parent} is a file, not a directory; choose another "
                             "train.output_dir")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserInputError(f"train.output_dir={out}: {parent} is not writable; choose another train.output_dir")
    outer = enclosing_run(os.path.dirname(out))
    if outer is not None:  # a run's directory holds only what that run writes (its --fresh would refuse)
        raise UserInputError(f"train.output_dir={out} lies inside the run directory {outer} (it has a {RUN_MARKER} "
                             "marker): give the run a directory of its own, outside any other run's")
    if not os.path.isdir(out):
        return
    if fresh:
        for name, where in (("the working directory", os.getcwd()), ("your home directory", os.path.expanduser("~"))):
            if is_same_or_parent(out, where):
                raise UserInputError(f"--fresh with train.output_dir={out}: that is {name} (or holds it); --fresh "
                                     "only clears a run's own directory: give train.output_dir a directory of its own")
    foreign = foreign_entries(out, entries) if fresh else []
    if foreign:
        raise UserInputError(f"--fresh with train.output_dir={out}: it holds {foreign[0]}"
                             f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}, which no {kind} run "
                             "wrote; nothing was removed. Move those files or choose another train.output_dir")
    _refuse_unmarked(out, kind, fresh)


# Locks this process holds, by directory: a second job in the same process (a bench, a test)
# takes the lock again instead of refusing itself; another process is refused.
_held: dict[str, int] = {}


def lock_output_dir(out: str) -> None:
    """Hold `out`'s RUN_LOCK for the rest of the process (or until `release_output_dir`); refuse,
    naming the other process, while another process holds it. Remote directories are not locked
    (no flock there); on a multi-host job only the first host locks (the others share the run)."""
    if "://" in out or os.path.realpath(out) in _held:
        return
    import jax  # only here: the rest of this module needs no JAX

    if jax.process_index() != 0:
        return
    path = os.path.join(out, RUN_LOCK)
    if os.path.islink(path):  # a link in its place: replaced, the file it points at is never written
        os.remove(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        other = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise UserInputError(f"train.output_dir={out} is in use by another memsearcher-jax process (pid {other}): "
                             "two runs in one directory would mix their checkpoints and logs; wait for it to end "
                             "or choose another train.output_dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[os.path.realpath(out)] = fd


def release_output_dir(out: str) -> None:
    """Let go of `out`'s lock (the lock file stays: removing it would let two runs lock two files)."""
    fd = _held.pop(os.path.realpath(out), None) if "://" not in out else None
    if fd is not None:
        os.close(fd)


def prepare_output_dir(out: str, fresh: bool, entries: frozenset = RUN_ENTRIES, kind: str = "training") -> None:
    """Create the output dir with its marker and lock it (`lock_output_dir`); fresh: then remove
    what an earlier run wrote there (`entries`, except the marker and the lock), after
    `check_output_dir` has refused anything else (checked again under the lock)."""
    check_output_dir(out, fresh, entries, kind)
    if "://" in out:
        return
    os.makedirs(out, exist_ok=True)
    marker = os.path.join(out, RUN_MARKER)
    if not os.path.isfile(marker) or os.path.islink(marker):
        write_json(marker, {"written_by": f"memsearcher-jax {'train' if kind == 'training' else 'pretrain'}",
                            "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
    lock_output_dir(out)
    if not fresh:
        return
    check_output_dir(out, fresh, entries, kind)  # what another process may have written meanwhile
    for name in sorted(set(os.listdir(out)) & (entries - {RUN_MARKER, RUN_LOCK})):
        path = os.path.join(out, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    for name in os.listdir(out):
        if name.startswith(STAGING_PREFIX):
            shutil.rmtree(os.path.join(out, name))
        elif _killed_write(os.path.join(out, name)):
            os.remove(os.path.join(out, name))


def enclosing_run(path: str) -> str | None:
    """The run directory (one holding `RUN_MARKER`) that `path` is or lies inside, if any."""
    here = os.path.realpath(path)
    while True:
        if os.path.isfile(os.path.join(here, RUN_MARKER)):
            return here
        up = os.path.dirname(here)
        if up == here:
            return None
        here = up


def _source_dir(source: str) -> str:
    """A --checkpoint's run directory (its checkpoints/ or best/ given: the run above), or a --model dir."""
    path = os.path.abspath(os.path.expanduser(source)).rstrip(os.sep)
    return os.path.dirname(path) if os.path.basename(path) in (CHECKPOINTS_DIR, BEST_DIR) else path


def check_marked_out(out: str, marker: str, writer: str, source: str | None = None, hint: str = "") -> None:
    """Refuse, before any work, an --out that `writer` (`eval`, a bench) must not write in: a file
    (or a path under one), the directory `source` it reads (or one holding it or inside it), a
    directory inside a run's, and a non-empty directory no earlier `writer` marked (`marker`): its
    files are the user's (`hint`: said after that refusal)."""
    path = os.path.abspath(os.path.expanduser(out))
    parent = existing_parent(path)
    if not os.path.isdir(parent):
        raise UserInputError(f"--out {out}: {parent} is a file, not a directory; give a new directory")
    if source and (is_same_or_parent(_source_dir(source), path) or is_same_or_parent(path, _source_dir(source))):
        raise UserInputError(f"--out {out} is (or holds, or lies inside) the evaluated directory {source}: give a "
                             "directory of its own")
    run = enclosing_run(parent)
    if run is not None:
        raise UserInputError(f"--out {out} lies inside the run directory {run} (it has a {RUN_MARKER} marker): "
                             "a run's directory holds only what the run writes; give a directory outside it")
    if os.path.isdir(path) and os.listdir(path) and not os.path.isfile(os.path.join(path, marker)):
        held = sorted(os.listdir(path))
        raise UserInputError(f"--out {out} is not empty (it holds {os.path.join(path, held[0])}"
                             f"{f' and {len(held) - 1} more' if len(held) > 1 else ''}) and no earlier {writer} wrote "
                             f"it (no {marker} marker); nothing was written. Give a new or empty directory{hint}")


def prepare_marked_out(out: str, marker: str, writer: str, files, source: str | None = None,
                       written_by: str | None = None) -> str:
    """`check_marked_out` again (the work may have taken hours), then the directory with its
    marker (naming `written_by`, default `writer`, and the `files` it writes there); returns the
    directory, absolute."""
    check_marked_out(out, marker, writer, source)
    path = os.path.abspath(os.path.expanduser(out))
    os.makedirs(path, exist_ok=True)
    if not os.path.isfile(os.path.join(path, marker)) or os.path.islink(os.path.join(path, marker)):
        write_json(os.path.join(path, marker), {"written_by": written_by or writer, "files": list(files),
                                                "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return path


def check_eval_out(out: str, source: str | None = None) -> None:
    """`check_marked_out` for `eval --out` (`EVAL_MARKER`): a non-empty directory no earlier eval
    wrote holds the user's results.json and trajectories.jsonl. Nothing to check without --out."""
    if out:
        check_marked_out(out, EVAL_MARKER, "eval", source)


def prepare_eval_out(out: str, source: str | None = None) -> dict[str, str]:
    """`prepare_marked_out` for `eval --out`; returns the paths of the files eval writes there ({name: path})."""
    path = prepare_marked_out(out, EVAL_MARKER, "eval", EVAL_FILES, source, written_by="memsearcher-jax eval")
    return {name: os.path.join(path, name) for name in EVAL_FILES}


# ----------------------------------------------------------------------------- the recorded experiment

# Keys a resumed run may change: how long it runs, how often it logs, evaluates and saves, where
# its files and caches are, how the same computation is laid out or batched. Every other key
# (workflow, objectives, world, warm start, reward, losses, optimizer, data, model) is the
# experiment: a resume that changes one mixes two experiments in one curve and one summary.
RESUMABLE = ("train.steps", "train.save_every", "train.keep", "train.eval_every", "train.log_samples_every",
             "train.samples_per_log", "train.wandb_project", "train.compilation_cache_dir", "train.output_dir",
             "world.cache_dir", "retrieval.url", "model.dtype", "model.remat", "sampler.batch_size",
             "sampler.prefill_query_block", "rl.micro_batch_size", "rl.logprob_batch_size", "rl.logits_chunk",
             "mesh.", "hardware.")


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_record(cfg: Settings) -> dict:
    """The settings as the run records it, every key (JSON: tuples become lists), each level's keys
    sorted as a ConfigDict wrote them (run_config.json stays byte-identical)."""
    return json.loads(json.dumps(cfg.to_dict(), default=str, sort_keys=True))


def changed_keys(recorded: dict, now: dict) -> list[tuple[str, object, object]]:
    """(key, recorded value, value now) for every key of both that changes the experiment. A key
    only one of them has (a config of another version) is not compared. train.steps is the
    experiment under a cosine schedule, whose length it sets; rl.micro_batch_size under
    rl.aggregation=microbatch_token_mean, whose loss weights it sets (each micro-batch's token mean)."""
    old, new = _flat(recorded), _flat(now)
    bound = {"train.steps": new.get("optim.schedule") == "cosine",
             "rl.micro_batch_size": new.get("rl.aggregation") == "microbatch_token_mean"}
    free = [k for k in RESUMABLE if not bound.get(k, False)]
    return [(k, old[k], new[k]) for k in sorted(old.keys() & new.keys())
            if old[k] != new[k] and not any(k == f or (f.endswith(".") and k.startswith(f)) for f in free)]


def saved_steps(out: str) -> list[int]:
    """The checkpoint steps in `out`'s checkpoints/ and best/ (one Orbax is still writing is none)."""
    dirs = [os.path.join(out, d) for d in (CHECKPOINTS_DIR, BEST_DIR)]
    return sorted({int(n) for d in dirs if os.path.isdir(d) for n in os.listdir(d) if n.isdigit()})


def _recorded_changes(cfg: Settings, out: str) -> list[tuple[str, object, object]]:
    """changed_keys between RUN_CONFIG in a local `out` and `cfg` ([] without one)."""
    path = os.path.join(out, RUN_CONFIG)
    if "://" in out or not os.path.isfile(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f)
    except (OSError, ValueError) as e:
        raise UserInputError(f"{path} cannot be read ({type(e).__name__}: {e}): it records the run's config; "
                             "restore it, or pass --fresh to start over") from None
    return changed_keys(recorded, config_record(cfg))


def starts_over(cfg: Settings, out: str) -> list[tuple[str, object, object]]:
    """The keys a rerun changes in a run directory whose earlier attempt stopped before its first
    checkpoint (a wrong setting, Ctrl-C in the warm start): with no checkpoint it holds no
    experiment to protect, so the job starts over there as --fresh does. [] otherwise."""
    return [] if saved_steps(out) else _recorded_changes(cfg, out)


def check_same_experiment(cfg: Settings, out: str) -> None:
    """A resumed run (a local output dir holding RUN_CONFIG) must keep the recorded experiment:
    TrainConfigError naming each changed key with both values. Where there is no checkpoint yet
    (`starts_over`), the changed command starts over instead, if --fresh could."""
    path = os.path.join(out, RUN_CONFIG)
    changed = _recorded_changes(cfg, out)
    if changed and not saved_steps(out):
        try:  # starting over there is --fresh's removal: refused where --fresh would be
            check_output_dir(out, fresh=True)
        except UserInputError as e:
            key, old, new = changed[0]
            raise UserInputError(f"train.output_dir={out} holds an earlier attempt with other settings ({key} "
                                 f"{old!r} -> {new!r}) and no checkpoint, so this run would start over there as "
                                 f"--fresh does, and that is refused: {e}") from None
        return
    if changed:
        what = ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in changed[:6])
        more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
        ckpts = os.path.join(out, "checkpoints")
        steps = sorted(int(n) for n in os.listdir(ckpts) if n.isdigit()) if os.path.isdir(ckpts) else []
        at = f"checkpoint step {steps[-1]}: " if steps else ""
        raise UserInputError(f"train.output_dir={out} holds a run of another experiment ({at}{what}{more}; recorded in "
                             f"{path}): resume it with those settings, or pass --fresh, or choose another "
                             "train.output_dir (only the steps, the logging, evaluation and checkpoint cadence, "
                             "paths and batching may change on resume, rl.micro_batch_size not under "
                             "rl.aggregation=microbatch_token_mean, whose loss weights it sets)")


def record_config(cfg: Settings, out: str) -> None:
    """Write RUN_CONFIG once, when the run starts (a run from before records its config now)."""
    path = os.path.join(out, RUN_CONFIG)
    if "://" in out or (os.path.isfile(path) and not os.path.islink(path)):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, config_record(cfg))
