"""Checks one saved item of a checkpoint step before Orbax restores it.

A restore that fails part-way (a data file cut short by a full disk or a half copy, a missing
one, an array of another shape) raises from one of Orbax's concurrent reads and leaves the
others pending on an event loop it has closed: they print asyncio tracebacks ("Exception
ignored in: <coroutine ...>", "Event loop is closed") after the caller's message, up to the
interpreter's exit. These checks read the item's tree metadata and one byte of each stored
value, synchronously, so a damaged checkpoint is refused before any restore starts.
"""
from __future__ import annotations

import json
import os

import jax
import orbax.checkpoint as ocp
import tensorstore as ts
from etils import epath

# Where the training loop keeps its checkpoints in its output directory (run_dir.py's list of a
# run's files reads these): every train.save_every steps, and the best eval/em so far.
CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"
# The items a step holds: what the loop saves, and what Orbax adds for a best_fn manager (the
# metrics it ranks the step by).
STEP_ITEMS = ("params", "opt_state", "meta", "metrics")


def leaf_shapes(tree) -> dict[str, tuple]:
    """{'layers/q_kernel/value': shape} of a live tree or of a checkpoint's tree metadata (the
    two name their leaves alike: dict keys, attribute names, sequence indices)."""
    name = lambda k: str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(map(name, path)): tuple(getattr(leaf, "shape", ())) for path, leaf in leaves}


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def shape_problem(item_dir: str, tree) -> str | None:
    """Arrays saved in item_dir with another shape than `tree`'s leaf of the same name (leaves
    only one side has are left to the restore, which refuses them before reading any data)."""
    handler = ocp.PyTreeCheckpointHandler()
    try:
        saved = handler.metadata(epath.Path(item_dir))
    except Exception as e:  # noqa: BLE001 - a missing or cut _METADATA raises many types
        return f"its metadata cannot be read ({_first_line(e)})"
    finally:
        handler.close()
    saved, now = leaf_shapes(getattr(saved, "tree", saved)), leaf_shapes(tree)
    differ = sorted(k for k in saved.keys() & now.keys() if saved[k] != now[k])
    if not differ:
        return None
    what = ", ".join(f"{k.removesuffix('/value')} {saved[k]} -> {now[k]}" for k in differ[:3])
    return f"arrays of another shape ({what}{', ...' if len(differ) > 3 else ''})"


def _written_as_ocdbt(item_dir: str) -> bool:
    try:
        with open(os.path.join(item_dir, "_METADATA"), encoding="utf-8") as f:
            return bool(json.load(f).get("use_ocdbt"))
    except (OSError, ValueError, AttributeError):  # shape_problem has read it: not expected
        return False


def data_problem(item_dir: str) -> str | None:
    """A stored value of item_dir's OCDBT store that cannot be read to its last byte: its data
    file is truncated (the read is out of range) or missing (the value reads back empty).
    None for a store Orbax did not write as OCDBT (nothing to check it against)."""
    if not os.path.isfile(os.path.join(item_dir, "manifest.ocdbt")):
        return "manifest.ocdbt is missing" if _written_as_ocdbt(item_dir) else None
    try:
        store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{os.path.abspath(item_dir)}/"}).result()
        keys = store.list().result()
    except Exception as e:  # noqa: BLE001 - TensorStore reports a cut manifest as ValueError, others vary
        return f"its index cannot be read ({_first_line(e)})"
    for key in keys:
        try:
            got = store.read(key, byte_range=slice(-1, None)).result()
        except Exception as e:  # noqa: BLE001 - a value past the end of its file: OUT_OF_RANGE
            return f"the data of {key.decode(errors='replace')} is cut short ({_first_line(e)})"
        if got.state != "value" or len(got.value) != 1:
            return f"the data of {key.decode(errors='replace')} is missing"
    return None


def item_problem(step_dir: str, name: str, tree) -> str | None:
    """Why item `name` of the checkpoint step in step_dir cannot be restored into `tree`'s
    shapes, naming the item; None when it can."""
    if "://" in step_dir:  # a bucket: Orbax's restore is the check
        return None
    item_dir = os.path.join(step_dir, name)
    if not os.path.isdir(item_dir):
        return f"{name}/ is missing"
    # The data first: reading the tree metadata of a store whose manifest is gone starts Orbax's
    # concurrent reads, which fail and leave the same pending coroutines a restore would.
    problem = data_problem(item_dir) or shape_problem(item_dir, tree)
    return f"{name}/: {problem}" if problem else None
