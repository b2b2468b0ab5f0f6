"""The training loop's checkpoints (`CheckpointedLoop`: save, resume, the best params), and the
checks of one saved item of a checkpoint step before Orbax restores it.

A restore that fails part-way (a data file cut short by a full disk or a half copy, a missing
one, an array of another shape) raises from one of Orbax's concurrent reads and leaves the
others pending on an event loop it has closed: they print asyncio tracebacks ("Exception
ignored in: <coroutine ...>", "Event loop is closed") after the caller's message, up to the
interpreter's exit. These checks read the item's tree metadata and one byte of each stored
value, synchronously, so a damaged checkpoint is refused before any restore starts.
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import orbax.checkpoint as ocp
import tensorstore as ts
from etils import epath

from memsearcher_jax.errors import UserInputError
from memsearcher_jax.rl import async_rollout

# Where the training loop keeps its checkpoints in its output directory (run_dir.py's list of a
# run's files reads these): every train.save_every steps, and the best eval/em so far.
CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"
# The items a step holds: what the loop saves, and what Orbax adds for a best_fn manager (the
# metrics it ranks the step by).
STEP_ITEMS = ("params", "opt_state", "meta", "metrics", async_rollout.BEHAVIOUR_ITEM)


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


class CheckpointedLoop:
    """The GRPO trainer's (`rl/trainer.py::Trainer`) atomic Orbax checkpoints, which a resumed run
    continues from exactly: params, optimizer state, step and the schedule's stage (the data
    position and the seeds follow from the step); with rl.max_staleness > 0 also the older weights
    its queued rollouts sample with (rl/async_rollout.py), so they are regenerated alike."""

    @property
    def checkpoints(self):
        if self._ckpt is None:
            opts = ocp.CheckpointManagerOptions(max_to_keep=self.loop.keep, enable_async_checkpointing=True)
            self._ckpt = ocp.CheckpointManager(self.out_dir / CHECKPOINTS_DIR, options=opts)
        return self._ckpt

    @property
    def best(self):
        """best/: the params with the highest eval/em so far (Orbax keeps one, by best_fn)."""
        if self._best is None:
            opts = ocp.CheckpointManagerOptions(max_to_keep=1, best_fn=lambda m: m["eval/em"], best_mode="max")
            self._best = ocp.CheckpointManager(self.out_dir / BEST_DIR, options=opts)
        return self._best

    def close(self) -> None:
        """Finish pending saves and stop the managers' threads (left to exit, they print asyncio errors)."""
        async_rollout.stop(self)
        for manager in (m for m in (self._ckpt, self._best) if m is not None):
            manager.close()
        self._ckpt = self._best = None

    def save(self, block: bool = False):
        # The data position and the step's seeds follow from step and seed (batch_for_step, _step_seed).
        meta = {"step": self.step, "skipped_steps": self.learner.skipped_steps,
                "skipped_updates": self.skipped_updates, "seed": self.loop.seed,
                "model_config": dataclasses.asdict(self.learner.model().config), **self.schedule.state(), **self.meta}
        behaviour, behaviour_meta = async_rollout.checkpoint_items(self)  # K > 0: the queued rollouts' weights
        # Params, optimizer state and metadata are separate items: export restores params alone.
        self.checkpoints.save(self.step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(self.learner.params), opt_state=ocp.args.StandardSave(self.learner.opt_state),
            meta=ocp.args.JsonSave({**meta, **behaviour_meta}), **behaviour), force=True)
        if block:
            self.checkpoints.wait_until_finished()

    def maybe_resume(self) -> bool:
        latest = self.checkpoints.latest_step()
        if latest is None:
            return False
        abstract = lambda tree: jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
        try:
            restored = self.checkpoints.restore(latest, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract(self.learner.params)),
                opt_state=ocp.args.StandardRestore(abstract(self.learner.opt_state)), meta=ocp.args.JsonRestore()))
        except Exception as e:  # noqa: BLE001 - Orbax/TensorStore raise many types for a damaged file
            where = f"{self.checkpoints.directory}/{latest}"
            raise UserInputError(f"cannot resume: the checkpoint of step {latest} ({where}) cannot be read "
                                 f"({type(e).__name__}); it is truncated or incomplete. Remove {where} to resume "
                                 "from the step before, or start over with --fresh") from None
        self.learner.params = restored["params"]
        self.learner.opt_state = restored["opt_state"]
        self.learner.skipped_steps = int(restored["meta"]["skipped_steps"])
        self.skipped_updates = int(restored["meta"].get("skipped_updates", 0))  # absent before it was recorded
        self.step = int(restored["meta"]["step"])
        self.schedule.restore(restored["meta"])
        self.sampler.update_params(self._sampling_model())
        if self.pipelined:
            self.restored_versions = async_rollout.restore_versions(self, latest, restored["meta"])
        return True

