"""The learner's host-side batching: from scored trajectories to the blocks its jitted calls take.

One GRPO step's rows, in the order the step meets them (docs/architecture.md, "One GRPO step"):

    trajectories + A_i --pack_rows (broadcast_to_rows: A_i on each of its conversations)--> RowBatch [R, S]
    RowBatch --gather_rows (multi-host)--> the global rows, as one process would have packed them
    rows --minibatch_row_indices--> `optimizer_steps` mini-batches (row indices)
    mini-batch --RowLayout._micro_batches--> micro-batch blocks on the mesh: rows of like length
        (loss_windows), or with rl.pack_rows the conversations first-fit into shared rows
        (first_fit, pack_segments: segments attending only to themselves, positions from 0 in each)

Every per-token array (weights included) moves with its token, so the weighted loss sum, and with
it every aggregation mode, is the unpacked one. `RowLayout` is the part of `GRPOLearner` that lays
rows into blocks and puts them on its mesh (the log-prob passes use it too; `to_host` brings their
results back); the rest is pure numpy, tested on hand-made lengths (tests/test_packing.py,
tests/test_grpo.py, tests/test_advantages.py).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from memsearcher_jax.agent.rollout import Trajectory
from memsearcher_jax.models.sharding import BATCH
from memsearcher_jax.rl.advantages import as_1d
from memsearcher_jax.rl.losses import aggregation_weights
from memsearcher_jax.runtime import distributed
from memsearcher_jax.sampling.buckets import bucket

# ----------------------------------------------------------------------------- rows

@dataclasses.dataclass
class RowBatch:
    """Packed conversation rows, right-padded. All arrays numpy, [R, S] unless noted.

    tokens: prompt + response ids; attention: 1 on real tokens; loss_mask: 1 on generated
    response tokens (position j holds token j, predicted from positions < j);
    sampler_logp: the sampler's log-prob of token j (0 elsewhere); advantages, traj_ids,
    group_ids, turns, is_final: [R].
    """

    tokens: np.ndarray
    attention: np.ndarray
    loss_mask: np.ndarray
    sampler_logp: np.ndarray
    advantages: np.ndarray
    traj_ids: np.ndarray
    group_ids: np.ndarray
    turns: np.ndarray
    is_final: np.ndarray

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    def take(self, idx: np.ndarray) -> RowBatch:
        return RowBatch(**{f.name: getattr(self, f.name)[idx] for f in dataclasses.fields(self)})

def broadcast_to_rows(traj_advantages, row_traj_ids, traj_ids=None) -> np.ndarray:
    """Give every row (conversation) its trajectory's advantage.

    traj_advantages: [N]; row_traj_ids: [R].
    With `traj_ids` None, row_traj_ids are positions 0..N-1 into traj_advantages; otherwise
    traj_ids [N] labels traj_advantages and row_traj_ids holds those labels.
    Returns [R] float32.
    """
    adv = as_1d("traj_advantages", traj_advantages)
    rows = as_1d("row_traj_ids", row_traj_ids)
    if traj_ids is None:
        if rows.size and (not np.issubdtype(rows.dtype, np.integer) or rows.min() < 0 or rows.max() >= adv.size):
            raise ValueError(
                f"row_traj_ids must be integer positions in [0, {adv.size}) when traj_ids is None, "
                f"got dtype {rows.dtype} range [{rows.min()}, {rows.max()}]"
            )
        return adv[rows.astype(np.int64)].astype(np.float32)
    labels = as_1d("traj_ids", traj_ids)
    if labels.shape != adv.shape:
        raise ValueError(f"traj_ids {labels.shape} must match traj_advantages {adv.shape}")
    index = {lab: i for i, lab in enumerate(labels.tolist())}
    if len(index) != labels.size:
        raise ValueError("traj_ids must be unique")
    missing = [t for t in rows.tolist() if t not in index]
    if missing:
        raise ValueError(f"row_traj_ids has ids not in traj_ids: {missing[:5]}")
    return adv[np.array([index[t] for t in rows.tolist()], np.int64)].astype(np.float32)

def pack_rows(trajs: Sequence[Trajectory], traj_advantages: np.ndarray, pad_id: int,
              min_len: int = 64, max_len: int | None = None) -> RowBatch:
    """One row per conversation; every conversation of trajectory i carries A_i. No trajectories:
    no rows (what a host whose groups were all filtered adds to the gathered rows)."""
    convs = [c for t in trajs for c in t.conversations]
    lengths = [len(c.prompt_ids) + len(c.response_ids) for c in convs]
    # Quarter octaves: a power of two could double the work.
    s = bucket(max(lengths, default=0), min_len, steps_per_octave=4)
    if max_len is not None and max(lengths, default=0) > max_len:
        raise ValueError(f"a conversation has {max(lengths)} tokens, over the trainer's max_len {max_len}")
    if max_len is not None:
        s = min(s, max_len)
    r = len(convs)
    tokens = np.full((r, s), pad_id, np.int32)
    attention = np.zeros((r, s), np.int32)
    loss_mask = np.zeros((r, s), np.float32)
    sampler_logp = np.zeros((r, s), np.float32)
    for i, c in enumerate(convs):
        p, n = len(c.prompt_ids), len(c.response_ids)
        tokens[i, :p + n] = c.prompt_ids + c.response_ids
        attention[i, :p + n] = 1
        loss_mask[i, p:p + n] = c.loss_mask
        sampler_logp[i, p:p + n] = c.sampler_logprobs
    traj_ids = np.array([c.traj_id for c in convs], np.int64)
    ordered_ids = np.array([t.traj_id for t in trajs], np.int64)
    adv = broadcast_to_rows(traj_advantages, traj_ids, ordered_ids).astype(np.float32)
    return RowBatch(tokens=tokens, attention=attention, loss_mask=loss_mask, sampler_logp=sampler_logp,
                    advantages=adv, traj_ids=traj_ids,
                    group_ids=np.array([c.group_id for c in convs], np.int64),
                    turns=np.array([c.turn for c in convs], np.int64),
                    is_final=np.array([c.is_final for c in convs], bool))

def gather_rows(rows: RowBatch, pad_id: int) -> RowBatch:
    """Every host's packed rows, in process order, on every host (a collective).

    The sequence length becomes the longest host's bucket, which is the bucket one process
    packing all the trajectories picks (buckets grow with the length); the extra columns are
    padding exactly as pack_rows writes it. So the result equals the single-process RowBatch.
    """
    fields = {f.name: getattr(rows, f.name) for f in dataclasses.fields(RowBatch)}
    return RowBatch(**distributed.allgather_rows(fields, pad_values={"tokens": pad_id}))


# ----------------------------------------------------------------------------- mini-batches

def minibatch_row_indices(traj_ids: np.ndarray, optimizer_steps: int, rng: np.random.Generator,
                          shuffle: bool = True, whole_trajectories: bool = False) -> list[np.ndarray]:
    """Split rows [R] into `optimizer_steps` mini-batches (row indices), shuffled unless told not to.
    With fewer rows (or trajectories) than optimizer_steps some are empty; the learner skips those.

    whole_trajectories: keep every trajectory's rows in one mini-batch (shuffling trajectories,
    not rows). `trajectory_mean` needs it: a trajectory split over two optimizer steps would
    weigh 1 in each, bringing back the bias toward long trajectories the mode exists to remove.
    """
    traj_ids = np.asarray(traj_ids)
    if not whole_trajectories:
        order = rng.permutation(len(traj_ids)) if shuffle else np.arange(len(traj_ids))
        return np.array_split(order, optimizer_steps)
    units = np.unique(traj_ids)
    if shuffle:
        units = units[rng.permutation(len(units))]
    rows_of = {u: np.flatnonzero(traj_ids == u) for u in units}
    return [np.concatenate([rows_of[u] for u in part]) if len(part) else np.zeros((0,), np.int64)
            for part in np.array_split(units, optimizer_steps)]


# ----------------------------------------------------------------------------- rows laid out for one call

def real_lengths(attention: np.ndarray) -> np.ndarray:
    """Tokens up to and including each right-padded row's last real one [R] (0: an empty row)."""
    real = attention != 0
    return np.where(real.any(axis=1), real.shape[1] - np.argmax(real[:, ::-1], axis=1), 0)

def loss_windows(loss_mask: np.ndarray, width: int, min_window: int) -> np.ndarray:
    """The target positions whose log-probs a loss over these rows reads: [R, W] int32, row i's
    W consecutive positions covering every position of loss_mask[i] (all its generated tokens).

    W is the whole-octave bucket (from min_window) of the longest row's span, at most width - 1,
    so a run meets a handful of window shapes. A window that would run past the last column is
    moved left to end there, so every position is distinct and real; a row with no loss
    positions (a padding row) gets positions 1..W."""
    mask = np.asarray(loss_mask)[:, :width] != 0
    has = mask.any(axis=1)
    first = np.where(has, np.argmax(mask, axis=1), 1)
    last = np.where(has, width - 1 - np.argmax(mask[:, ::-1], axis=1), 1)
    if has.any() and first[has].min() < 1:
        raise ValueError("loss_mask marks position 0, which no earlier token predicts")
    w = min(bucket(int((last - first).max()) + 1, min_window), width - 1)
    start = np.minimum(first, width - w)  # >= 1: first >= 1 (checked above) and w <= width - 1
    return (start[:, None] + np.arange(w)[None, :]).astype(np.int32)

def fit_block(a: np.ndarray, rows: int, width: int | None = None) -> np.ndarray:
    """a [n <= rows, ...] zero-padded to `rows` rows and, for [n, S] arrays, cut or zero-padded to
    `width` columns (the columns cut hold padding only: width covers every row's tokens)."""
    if width is not None:
        a = a[:, :width] if a.shape[1] >= width else np.pad(a, ((0, 0), (0, width - a.shape[1])))
    if a.shape[0] < rows:
        a = np.concatenate([a, np.zeros((rows - a.shape[0],) + a.shape[1:], a.dtype)])
    return a


# ----------------------------------------------------------------------------- packing (rl.pack_rows)

@dataclasses.dataclass(frozen=True)
class Packing:
    """Where `first_fit` put each conversation: conversation i (its lengths[i] real tokens) in
    packed row row[i] from slot offset[i]; num_rows rows of `width` slots."""

    row: np.ndarray
    offset: np.ndarray
    lengths: np.ndarray
    num_rows: int
    width: int

    def slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For every real token, flat: (its conversation, its slot there, its packed row, its slot there)."""
        conv = np.repeat(np.arange(len(self.lengths)), self.lengths)
        within = np.arange(conv.size) - np.repeat(np.cumsum(self.lengths) - self.lengths, self.lengths)
        return conv, within, self.row[conv], self.offset[conv] + within

def first_fit(lengths: np.ndarray, width: int) -> Packing:
    """First-fit decreasing: the longest conversation first, each into the first row with room for
    it, a new row when none has. At least one row (an all-empty batch keeps one of padding)."""
    lengths = np.asarray(lengths, np.int64)
    if lengths.size and lengths.max() > width:
        raise ValueError(f"a conversation of {lengths.max()} tokens cannot fit packed rows of {width}")
    row, offset = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    room: list[int] = []
    for i in np.argsort(-lengths, kind="stable"):
        n = int(lengths[i])
        r = next((k for k, free in enumerate(room) if free >= n), len(room))
        if r == len(room):
            room.append(width)
        row[i], offset[i] = r, width - room[r]
        room[r] -= n
    return Packing(row, offset, lengths, max(len(room), 1), width)

def pack_segments(arrays: dict[str, np.ndarray], packing: Packing) -> dict[str, np.ndarray]:
    """Per-token arrays [n, S] of n conversations laid out as `packing` says: [num_rows, width]
    each (0 in padding), plus "segments" (the conversation's index; -1 in padding) and
    "positions" (from 0 in each conversation)."""
    conv, within, row, slot = packing.slots()
    shape = (packing.num_rows, packing.width)
    out = {}
    for k, a in arrays.items():
        out[k] = np.zeros(shape, a.dtype)
        out[k][row, slot] = a[conv, within]
    out["segments"] = np.full(shape, -1, np.int32)
    out["segments"][row, slot] = conv
    out["positions"] = np.zeros(shape, np.int32)
    out["positions"][row, slot] = within
    return out

def packed_targets(loss_mask: np.ndarray, width: int, min_window: int) -> np.ndarray:
    """The target positions a loss over packed rows reads, [R, W] int32: each row's loss positions
    (every segment's generated tokens), then other positions (weight 0) up to W, sorted and
    distinct, all >= 1. W is the whole-octave bucket (from min_window) of the most loss positions
    a row has, at most width - 1: the head runs on these alone, as `loss_windows` does unpacked
    (one window over several segments would span most of the row)."""
    mask = np.asarray(loss_mask)[:, 1:width] != 0
    w = min(bucket(max(int(mask.sum(axis=1).max()), 1), min_window), width - 1)
    return np.sort(np.argsort(~mask, axis=1, kind="stable")[:, :w] + 1, axis=1).astype(np.int32)

def block_rows(n: int, cap: int, least: int = 1) -> int:
    """Rows of one call over n packed rows: n's half-octave bucket (1, 2, 3, 4, 6, 8, 12, ...: a
    handful of shapes, at most a third of the rows spare) as a multiple of `least` (the mesh's batch
    shards, so the rows still split over them), at most `cap` (what the planner sized)."""
    return min(bucket(n, least, steps_per_octave=2, multiple_of=least), cap)


# ----------------------------------------------------------------------------- the learner's blocks on its mesh

def to_host(x: jax.Array) -> np.ndarray:
    """Fetch a (possibly multi-host sharded) array to every host."""
    if jax.process_count() > 1 and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


_ROW_KEYS = ("tokens", "attention", "positions", "segments")  # whole rows: the trunk reads every slot


class RowLayout:
    """How `GRPOLearner` lays rows into the blocks its jitted calls take, and puts them on its mesh.

    A base class of `GRPOLearner` (rl/grpo.py), which gives it `config` (a GRPOConfig:
    min_seq_len, max_seq_len, micro_batch_size, loss.aggregation, pack_rows) and `mesh` (None: one device)."""

    def _batch_shards(self) -> int:
        return 1 if self.mesh is None or self.mesh.size == 1 else self.mesh.shape["data"] * self.mesh.shape["fsdp"]

    def _put(self, x: np.ndarray, batch_axis: int):
        if self.mesh is None or self.mesh.size == 1:
            return jnp.asarray(x)
        spec = [None] * x.ndim
        n = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if x.shape[batch_axis] % n == 0:
            spec[batch_axis] = BATCH
        return jax.device_put(x, NamedSharding(self.mesh, P(*spec)))

    def row_width(self, lengths: np.ndarray, columns: int) -> int:
        """Columns one call gives rows of these real lengths: the longest's whole-octave bucket
        (from min_seq_len), never wider than the packed rows' own `columns` (pack_rows' bucket of
        the step's longest row, what the planner sizes) nor max_seq_len. Coarse on purpose: the
        calls below the longest take a handful of widths a whole run shares."""
        cfg = self.config
        return min(bucket(int(lengths.max()), cfg.min_seq_len), cfg.max_seq_len, columns)

    def _pack(self, arrays: dict[str, np.ndarray], lengths: np.ndarray) -> tuple[dict[str, np.ndarray], Packing]:
        """Conversations' per-token arrays -> packed rows as wide as the longest one's bucket (never
        wider than the unpacked rows the planner sizes), and the packing."""
        if (arrays["loss_mask"][:, 0] != 0).any():
            raise ValueError("loss_mask marks position 0, which no earlier token predicts")
        packing = first_fit(lengths, self.row_width(lengths, arrays["tokens"].shape[1]))
        return pack_segments(arrays, packing), packing

    def _packed_block(self, packed: dict[str, np.ndarray], part: np.ndarray, cap: int) -> dict[str, np.ndarray]:
        """Packed rows `part` as one call's block of block_rows rows (the spare ones padding)."""
        rows = block_rows(len(part), cap, self._batch_shards())
        return {k: fit_block(a[part] + 1, rows) - 1 if k == "segments" else fit_block(a[part], rows)
                for k, a in packed.items()}

    def _length_blocks(self, micro: dict, lengths: np.ndarray, columns: int):
        """Unpacked micro-batches: rows of like length together, each block as wide as its longest row."""
        mbs = self.config.micro_batch_size
        order = np.argsort(lengths, kind="stable")
        for m in range(0, len(order), mbs):
            part = order[m:m + mbs]
            width = self.row_width(lengths[part], columns)
            yield {k: fit_block(a[part], mbs, width) if a.ndim == 2 else fit_block(a[part], mbs)
                   for k, a in micro.items()}, width

    def _packed_blocks(self, micro: dict, lengths: np.ndarray):
        """Packed micro-batches: the mini-batch's conversations first-fit into rows, micro_batch_size
        rows a block. The advantage goes on every token of its conversation."""
        mbs = self.config.micro_batch_size
        arrays = {k: a for k, a in micro.items() if a.ndim == 2 and k != "attention"}
        arrays["advantages"] = np.broadcast_to(micro["advantages"][:, None], micro["tokens"].shape)
        packed, packing = self._pack(arrays, lengths)
        for i in range(0, packing.num_rows, mbs):
            yield self._packed_block(packed, np.arange(i, min(i + mbs, packing.num_rows)), mbs), packing.width

    def _micro_batches(self, rows: RowBatch, idx: np.ndarray, old_logp, ref_logp, tis) -> tuple[list, float]:
        """One mini-batch (row indices idx, non-empty) as micro-batches of [micro_batch_size, width]
        device arrays (zero rows pad the last: weight 0, so they add nothing), and its loss denominator.

        The aggregation weights are those of the rows split in order (row j in micro-batch
        j // micro_batch_size: what microbatch_token_mean normalises by); the gradient is then a
        weighted sum over tokens, so the rows may be regrouped for computing: rows of like length
        share a micro-batch, and each micro-batch is only as wide as its longest row; with
        rl.pack_rows, conversations share packed rows (`_packed_blocks`; the last block only as
        many rows as block_rows gives). ref_logp None: no reference log-probs (kl_coef 0)."""
        cfg = self.config
        n_micro = math.ceil(len(idx) / cfg.micro_batch_size)
        weights, denom = aggregation_weights(cfg.loss.aggregation, rows.loss_mask[idx], rows.traj_ids[idx],
                                             np.arange(len(idx)) // cfg.micro_batch_size, n_micro)
        micro = {"tokens": rows.tokens[idx], "attention": rows.attention[idx], "loss_mask": rows.loss_mask[idx],
                 "weights": weights, "advantages": rows.advantages[idx], "old_logp": old_logp[idx],
                 **({"ref_logp": ref_logp[idx]} if ref_logp is not None else {}),
                 **({"tis": tis[idx]} if tis is not None else {})}
        lengths = real_lengths(micro["attention"])
        if cfg.pack_rows:
            blocks, targets = self._packed_blocks(micro, lengths), packed_targets
        else:
            blocks, targets = self._length_blocks(micro, lengths, rows.tokens.shape[1]), loss_windows
        out = []
        for block, width in blocks:
            # The per-token arrays only at the positions the loss reads (the head runs on those alone).
            at = targets(block["loss_mask"], width, cfg.min_seq_len)
            block = {k: np.take_along_axis(a, at, axis=1) if a.ndim == 2 and k not in _ROW_KEYS else a
                     for k, a in block.items()}
            out.append({k: self._put(a, 0) for k, a in dict(block, targets_at=at).items()})
        return out, denom

    def update_slots(self, lengths: np.ndarray, columns: int) -> tuple[int, int]:
        """Slots (rows x width, spare rows included) the update computes over one mini-batch of
        conversations of these real lengths: (unpacked, packed). The padding metrics' denominators."""
        mbs = self.config.micro_batch_size
        order = np.sort(lengths)
        unpacked = sum(mbs * self.row_width(order[i:i + mbs], columns) for i in range(0, len(order), mbs))
        width = self.row_width(lengths, columns)
        n = first_fit(lengths, width).num_rows
        packed = width * sum(block_rows(min(mbs, n - i), mbs, self._batch_shards()) for i in range(0, n, mbs))
        return unpacked, packed

    def _padding_metrics(self, rows: RowBatch, minibatches: list[np.ndarray]) -> dict:
        """The share of the update's slots that hold no token, unpacked and packed (whichever runs)."""
        lengths = real_lengths(rows.attention)
        slots = np.array([self.update_slots(lengths[idx], rows.tokens.shape[1]) for idx in minibatches]).reshape(-1, 2)
        real = float(sum(lengths[idx].sum() for idx in minibatches))
        if real == 0:
            return {"pad_frac_unpacked": 0.0, "pad_frac_packed": 0.0}
        unpacked, packed = (float(x) for x in slots.sum(axis=0))
        return {"pad_frac_unpacked": 1.0 - real / unpacked, "pad_frac_packed": 1.0 - real / packed}
