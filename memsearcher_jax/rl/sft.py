"""Supervised warm start: masked next-token cross-entropy on agent rows (e.g. scripted demos).

    model, history = sft_train(model, conversations, SFTConfig(steps=300, lr=3e-3), pad_id=builder.pad_id)

Each row is one conversation laid out as prompt + response. The model reads ids[:-1] and is
scored on ids[1:] only where the target token is a generated one (loss_mask 1): prompts,
observations and padding never contribute. The loss is an exact token mean over the batch
(sum of masked NLL / number of masked tokens). Rows are right-padded to a fixed bucket length
(`sampling.buckets.bucket` in quarter octaves from `min_len`, as GRPO rows are), so the step
compiles once per bucket actually used. With `max_batch_tokens`, a batch padded past that many
slots is split into micro-batches (`plan_micro_batches`) whose summed gradients make one update,
the same one up to float rounding: long agent conversations then fit in memory.
Parameters travel as jit arguments (nnx.split), not closed-over constants.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from memsearcher_jax.rl.learner import (
    Learner,
    OptimConfig,
    apply_update,
    make_optimizer,
    tie_row_updates,
)
from memsearcher_jax.sampling.buckets import bucket
from memsearcher_jax.sampling.distributions import token_logprobs


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Defaults: the sft.* keys' (max_len: agent.max_context_tokens; settings/; tests/test_lower_defaults.py)."""
    steps: int = 200
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 20               # linear warm-up steps, then cosine decay to lr * final_lr_fraction
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    max_len: int = 16384           # rows are cut to this many tokens (prompt + response)
    min_len: int = 128             # the smallest row bucket; rows pad to quarter-octave buckets above
    progress: bool = True          # tqdm bar
    # A batch padded to more than this many slots (rows x bucket length) is split into
    # micro-batches of at most this many, gradients summed into one update; 0: never split.
    max_batch_tokens: int = 0

    def __post_init__(self):
        problems = []
        if self.max_batch_tokens < 0:
            problems.append(f"max_batch_tokens must be >= 0 (0: one program per batch), got {self.max_batch_tokens}")
        for name in ("steps", "batch_size", "max_len"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup < max(self.steps, 1) + 1:
            problems.append(f"warmup must be in [0, steps], got {self.warmup}")
        if not 0 <= self.final_lr_fraction <= 1:
            problems.append(f"final_lr_fraction must be in [0, 1], got {self.final_lr_fraction}")
        if self.min_len < 2:
            problems.append(f"min_len must be >= 2, got {self.min_len}")
        if problems:
            raise ValueError("invalid SFTConfig: " + "; ".join(problems))

    def bucket_for(self, n: int) -> int:
        """The row length n tokens pad to: the shared bucket rule, quarter octaves from min_len."""
        return bucket(n, self.min_len, steps_per_octave=4)


@dataclasses.dataclass(frozen=True)
class SFTRows:
    """Shifted rows: inputs[i, t] predicts targets[i, t], counted where weights[i, t] = 1."""

    inputs: np.ndarray    # int32 [N, L]
    targets: np.ndarray   # int32 [N, L]
    weights: np.ndarray   # float32 [N, L]
    lengths: np.ndarray   # int32 [N] real positions per row
    truncated: int        # rows cut to max_len

    def take(self, idx, length: int) -> SFTRows:
        return SFTRows(self.inputs[idx, :length], self.targets[idx, :length], self.weights[idx, :length],
                       self.lengths[idx], 0)


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """Positions `idx` into a batch's rows, run as `rows` rows padded to `width` (rows beyond
    len(idx) repeat one of them at weight 0, so the program's shape is a fixed one)."""

    idx: np.ndarray
    rows: int
    width: int


def plan_micro_batches(lengths: np.ndarray, max_batch_tokens: int, bucket_for) -> list[MicroBatch]:
    """A batch of rows of `lengths` as micro-batches of at most max_batch_tokens slots each
    (rows x width; a row longer than that alone, in one row).

    Longest rows first, so each micro-batch pads to the bucket (`bucket_for`) of its first row
    and shorter rows pack more per micro-batch. Row counts are powers of two (the most that fit,
    or the next one above what is left), so for each bucket only a few shapes ever compile.
    """
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    plan, at = [], 0
    while at < len(order):
        width = int(bucket_for(int(lengths[order[at]])))
        cap = 1 << max((max_batch_tokens // width).bit_length() - 1, 0)  # largest power of two that fits, >= 1
        take = min(cap, len(order) - at)
        plan.append(MicroBatch(order[at:at + take], min(cap, 1 << (take - 1).bit_length()), width))
        at += take
    return plan


def _sequences(conversations: Sequence, max_tokens: int) -> tuple[list[tuple[list[int], list[int]]], int]:
    """Each conversation as (ids, loss mask over ids), cut to max_tokens; and how many were cut."""
    seqs, truncated = [], 0
    for i, c in enumerate(conversations):
        if len(c.response_ids) != len(c.loss_mask):
            raise ValueError(f"conversation {i}: {len(c.response_ids)} response ids but {len(c.loss_mask)} mask values")
        ids = list(c.prompt_ids) + list(c.response_ids)
        mask = [0] * len(c.prompt_ids) + [float(m) for m in c.loss_mask]  # weights (0/1, or a copy target's)
        if len(ids) > max_tokens:
            ids, mask, truncated = ids[:max_tokens], mask[:max_tokens], truncated + 1
        seqs.append((ids, mask))
    return seqs, truncated


def build_rows(conversations: Sequence, pad_id: int, max_len: int) -> SFTRows:
    """Conversations (prompt_ids, response_ids, loss_mask) -> shifted, right-padded arrays.

    A row longer than max_len tokens keeps its first max_len tokens (counted in `truncated`).
    """
    if not conversations:
        raise ValueError("build_rows: no conversations")
    pairs, truncated = _sequences(conversations, max_len)
    seqs, masks = [ids for ids, _ in pairs], [mask for _, mask in pairs]
    width = max(len(s) for s in seqs) - 1
    n = len(seqs)
    inputs = np.full((n, max(width, 1)), pad_id, np.int32)
    targets = np.full((n, max(width, 1)), pad_id, np.int32)
    weights = np.zeros((n, max(width, 1)), np.float32)
    lengths = np.zeros(n, np.int32)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        k = len(s) - 1
        inputs[i, :k] = s[:-1]
        targets[i, :k] = s[1:]
        weights[i, :k] = m[1:]
        lengths[i] = k
    return SFTRows(inputs, targets, weights, lengths, truncated)


@dataclasses.dataclass(frozen=True)
class PackedRows:
    """Several shifted sequences per row: inputs[r, t] predicts targets[r, t], counted where
    weights[r, t] = 1; segments[r, t] is the sequence a slot belongs to (-1 = padding) and
    positions restart at 0 in each sequence."""

    inputs: np.ndarray     # int32 [R, W]
    targets: np.ndarray    # int32 [R, W]
    weights: np.ndarray    # float32 [R, W]
    positions: np.ndarray  # int32 [R, W]
    segments: np.ndarray   # int32 [R, W]
    truncated: int         # sequences cut to the row width
    loss_at: np.ndarray | None = None       # int32 [K]: `loss_slots` of weights (flat indices)
    loss_weights: np.ndarray | None = None  # float32 [K]


def pack_rows(conversations: Sequence, pad_id: int, width: int) -> PackedRows:
    """Conversations -> rows of `width` slots holding several sequences each (first-fit
    decreasing), so a step of short and long rows is not padded to its longest one. The row
    count rounds up to a quarter-octave bucket (few compiled shapes); spare rows are padding.

    The loss over packed rows equals the padded one (`build_rows`): each sequence attends only
    to itself (segments), its positions restart at 0, and the token mean runs over the same
    masked tokens.
    """
    if not conversations:
        raise ValueError("pack_rows: no conversations")
    seqs, truncated = _sequences(conversations, width + 1)  # n tokens, shifted, fill n - 1 slots
    seqs = [s for s in seqs if len(s[0]) >= 2]
    bins: list[list[int]] = []  # sequence indices per row
    room: list[int] = []
    for i in sorted(range(len(seqs)), key=lambda i: -len(seqs[i][0])):
        need = len(seqs[i][0]) - 1
        row = next((r for r, free in enumerate(room) if free >= need), None)
        if row is None:
            bins.append([])
            room.append(width)
            row = len(bins) - 1
        bins[row].append(i)
        room[row] -= need
    rows = bucket(len(bins), 1, steps_per_octave=4)
    inputs = np.full((rows, width), pad_id, np.int32)
    targets = np.full((rows, width), pad_id, np.int32)
    weights = np.zeros((rows, width), np.float32)
    positions = np.zeros((rows, width), np.int32)
    segments = np.full((rows, width), -1, np.int32)
    for r, members in enumerate(bins):
        at = 0
        for i in members:
            ids, mask = seqs[i]
            k = len(ids) - 1
            inputs[r, at:at + k], targets[r, at:at + k] = ids[:-1], ids[1:]
            weights[r, at:at + k] = mask[1:]
            positions[r, at:at + k] = np.arange(k)
            segments[r, at:at + k] = i
            at += k
    return PackedRows(inputs, targets, weights, positions, segments, truncated, *loss_slots(weights))


# The fewest loss slots a step pads to; K doubles from here (few compiled shapes: each K is
# another program for every row shape, and the padding costs only head work on K slots).
MIN_LOSS_SLOTS = 64


def loss_slots(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the loss reads: (flat indices [K] of the weighted slots of a [R, W] batch, their
    weights [K]), K rounded up to a power-of-two multiple of MIN_LOSS_SLOTS; the extra entries
    point at slot 0 with weight 0. The head (the vocabulary matmul) and its log-softmax then run
    on K positions instead of R x W: agent rows and reading drills train on a few answer tokens
    among long prompts and observations (4-8% of a pretraining step's slots, ~20% of a warm start's)."""
    flat = np.flatnonzero(weights.reshape(-1) > 0).astype(np.int32)
    k = bucket(max(len(flat), 1), MIN_LOSS_SLOTS, steps_per_octave=1)
    at = np.zeros(k, np.int32)
    w = np.zeros(k, np.float32)
    at[:len(flat)] = flat
    w[:len(flat)] = weights.reshape(-1)[flat]
    return at, w


def gathered_nll_sum(model, hidden: jax.Array, targets: jax.Array, loss_at: jax.Array,
                     loss_weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of weighted NLL, sum of weights) with the head run only at `loss_at` (`loss_slots`):
    hidden [R, W, D] final states, targets [R, W]. The same sums as the head over every slot."""
    h = hidden.reshape(-1, hidden.shape[-1])[loss_at][None]       # [1, K, D]
    nll = -token_logprobs(model.logits_from_hidden(h), targets.reshape(-1)[loss_at][None])[0]
    return jnp.sum(nll * loss_weights), jnp.sum(loss_weights)


def packed_nll_sum(model, inputs: jax.Array, targets: jax.Array, weights: jax.Array, positions: jax.Array,
                   segments: jax.Array, loss_at: jax.Array | None = None,
                   loss_weights: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(sum of weighted token NLL, sum of weights) over packed rows (see `PackedRows`); with
    loss_at / loss_weights (`loss_slots`), the head runs at those slots only (same sums)."""
    if loss_at is not None:
        h = model.hidden_states(inputs, positions=positions, segment_ids=segments)
        return gathered_nll_sum(model, h, targets, loss_at, loss_weights)
    nll = -token_logprobs(model(inputs, positions=positions, segment_ids=segments), targets)
    w = weights * (segments >= 0)
    return jnp.sum(nll * w), jnp.sum(w)


def _pad_to(a: np.ndarray, length: int, fill) -> np.ndarray:
    if a.shape[1] >= length:
        return a[:, :length]
    return np.concatenate([a, np.full((a.shape[0], length - a.shape[1]), fill, a.dtype)], axis=1)


def masked_nll_sum(model, inputs: jax.Array, targets: jax.Array, weights: jax.Array,
                   lengths: jax.Array, loss_at: jax.Array | None = None,
                   loss_weights: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(sum of weighted token NLL, sum of weights). Padding past `lengths` is masked from attention.
    With loss_at / loss_weights (`loss_slots` of the weights inside `lengths`), the head runs at
    those slots only (same sums)."""
    positions = jnp.arange(inputs.shape[1])[None, :]
    attention = positions < lengths[:, None]
    if loss_at is not None:
        return gathered_nll_sum(model, model.hidden_states(inputs, attention_mask=attention), targets, loss_at,
                                loss_weights)
    nll = -token_logprobs(model(inputs, attention_mask=attention), targets)
    w = weights * attention
    return jnp.sum(nll * w), jnp.sum(w)


@functools.partial(jax.jit, static_argnums=0)
def _nll_sum_split(graphdef, params, inputs, targets, weights, lengths):
    # Module level with a static graphdef: every model of one architecture shares the compilation.
    return masked_nll_sum(nnx.merge(graphdef, params), inputs, targets, weights, lengths)


def optim_config(cfg: SFTConfig) -> OptimConfig:
    """Linear warm-up, then cosine decay to lr * final_lr_fraction at the last step."""
    return OptimConfig(learning_rate=cfg.lr, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
                       schedule="cosine", warmup_steps=cfg.warmup, total_steps=max(cfg.steps, cfg.warmup + 1),
                       final_lr_fraction=cfg.final_lr_fraction)


class SFTTrainer(Learner):
    """The masked-NLL learner: split params + optimizer state, one jitted donated step.

    optim: the optimizer's settings (default: `optim_config(config)`, warm-up + cosine).
    tied_rows: groups of token ids (a list of id lists) whose embedding rows share one update
    per group: the reading base keeps each name token at (a trained vector shared by its
    type) + (its own fixed random code), so a name it never saw looks like the ones it did.
    """

    def __init__(self, model, config: SFTConfig, tied_rows=None, optim: OptimConfig | None = None):
        if model.config.lora:
            raise ValueError("SFT trains every weight: give it a model without LoRA adapters (lora_rank 0)")
        super().__init__(model, make_optimizer(optim or optim_config(config)))
        self.config = config
        self.skipped_steps = 0
        graphdef, tx = self.graphdef, self.tx
        tie = None
        if tied_rows:
            groups = np.full(model.config.vocab_size, -1, np.int32)
            for g, ids in enumerate(tied_rows):
                groups[np.asarray(ids)] = g
            row_group, num_groups = jnp.asarray(groups), len(tied_rows)
            tie = lambda updates: tie_row_updates(updates, row_group, num_groups)

        def step_on(nll_sum):
            """One optimizer step on the mean token NLL of the rows, as `nll_sum` lays them out."""
            def loss_fn(params, *rows):
                total, count = nll_sum(nnx.merge(graphdef, params), *rows)
                return total / jnp.maximum(count, 1.0), count

            @self.donating_jit
            def step(params, opt_state, *rows):
                (loss, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, *rows)
                params, opt_state, gnorm, skipped = apply_update(params, opt_state, grads, tx, tie)
                return params, opt_state, loss, count, gnorm, skipped
            return step

        self._step = step_on(masked_nll_sum)            # padded rows [B, L]
        self._packed_step = step_on(packed_nll_sum)     # packed rows with segment ids
        self._zero_sums, self._accumulate, self._update = _accumulating_steps(graphdef, tx, tie)

    def train_packed(self, rows: PackedRows) -> dict:
        """One update on packed rows (`pack_rows`): the same loss as `train_step` on the same
        conversations, without the padding up to the longest one."""
        slots = () if rows.loss_at is None else (rows.loss_at, rows.loss_weights)
        self.params, self.opt_state, loss, count, gnorm, skipped = self._packed_step(
            self.params, self.opt_state, rows.inputs, rows.targets, rows.weights, rows.positions, rows.segments,
            *slots)
        self.skipped_steps += int(skipped)
        return {"loss": float(loss), "tokens": int(count), "grad_norm": float(gnorm), "length": rows.inputs.shape[1],
                "rows": rows.inputs.shape[0], "skipped": bool(skipped),
                "slots_used": float(np.mean(rows.segments >= 0))}

    def train_step(self, rows: SFTRows, idx) -> dict:
        """One update on the rows at idx: one program, or (past `max_batch_tokens` padded slots)
        the gradients of micro-batches summed, then divided by the batch's loss tokens."""
        budget = self.config.max_batch_tokens
        width = self.config.bucket_for(int(rows.lengths[idx].max()))
        if budget and len(idx) * width > budget:
            return self._accumulated_step(rows, np.asarray(idx), width)
        inputs, targets, weights, lengths = _padded(rows, idx, self.config)  # weights 0 past each length
        self.params, self.opt_state, loss, count, gnorm, skipped = self._step(self.params, self.opt_state, inputs,
                                                                              targets, weights, lengths,
                                                                              *loss_slots(weights))
        self.skipped_steps += int(skipped)
        return {"loss": float(loss), "tokens": int(count), "grad_norm": float(gnorm), "length": inputs.shape[1],
                "skipped": bool(skipped), "micro_batches": 1}

    def _accumulated_step(self, rows: SFTRows, idx: np.ndarray, width: int) -> dict:
        plan = plan_micro_batches(rows.lengths[idx], self.config.max_batch_tokens, self.config.bucket_for)
        acc = self._zero_sums(self.params)
        for mb in plan:
            sel = idx[mb.idx]
            sel = np.concatenate([sel, np.full(mb.rows - len(sel), sel[0])])  # fill rows: repeats at weight 0
            inputs, targets, weights, lengths = _padded(rows, sel, self.config, mb.width)
            weights = weights.copy()
            weights[len(mb.idx):] = 0.0
            acc = self._accumulate(acc, self.params, inputs, targets, weights, lengths, *loss_slots(weights))
        self.params, self.opt_state, loss, count, gnorm, skipped = self._update(self.params, self.opt_state, acc)
        self.skipped_steps += int(skipped)
        return {"loss": float(loss), "tokens": int(count), "grad_norm": float(gnorm), "length": width,
                "skipped": bool(skipped), "micro_batches": len(plan)}

    def evaluate(self, rows: SFTRows) -> float:
        return _evaluate(self.graphdef, self.params, rows, self.config)


def _accumulating_steps(graphdef, tx, tie):
    """(zero_sums, accumulate, update): summed masked-NLL gradients over micro-batches, then one
    update dividing them by the batch's loss tokens. As GRPOLearner's: one program per micro-batch
    shape, called in a Python loop, and one for the update, whatever the micro-batch count."""
    grad_fn = jax.value_and_grad(lambda params, *rows: masked_nll_sum(nnx.merge(graphdef, params), *rows),
                                 has_aux=True)

    @jax.jit
    def zero_sums(params):
        return jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params), jnp.zeros((), jnp.float32), \
            jnp.zeros((), jnp.float32)

    @functools.partial(jax.jit, donate_argnums=(0,))
    def accumulate(acc, params, *rows):
        (total, count), g = grad_fn(params, *rows)
        return jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc[0], g), acc[1] + total, acc[2] + count

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def update(params, opt_state, acc):
        grads, total, count = acc
        denominator = jnp.maximum(count, 1.0)  # the unsplit loss's normalisation
        grads = jax.tree.map(lambda g, p: (g / denominator).astype(p.dtype), grads, params)
        params, opt_state, gnorm, skipped = apply_update(params, opt_state, grads, tx, tie)
        return params, opt_state, total / denominator, count, gnorm, skipped

    return zero_sums, accumulate, update


def _padded(rows: SFTRows, idx, config: SFTConfig, length: int | None = None) -> tuple:
    """The rows at idx padded to `length` (default: their bucket; targets padded with 0, weights with 0)."""
    length = length or config.bucket_for(int(rows.lengths[idx].max()))
    sub = rows.take(idx, length)
    return (_pad_to(sub.inputs, length, 0), _pad_to(sub.targets, length, 0),
            _pad_to(sub.weights, length, 0.0), sub.lengths)


def _evaluate(graphdef, params, rows: SFTRows, config: SFTConfig) -> float:
    """Exact masked token-mean NLL over all rows (batched sums, one division)."""
    bs = config.batch_size
    total, count = 0.0, 0.0
    order = np.argsort(rows.lengths)  # similar lengths share a bucket
    for s in range(0, len(order), bs):
        idx = order[s:s + bs]
        real = len(idx)
        if real < bs:  # keep one batch shape per bucket: repeat a row with zero weight
            idx = np.concatenate([idx, np.full(bs - real, idx[0])])
        inputs, targets, weights, lengths = _padded(rows, idx, config)
        if real < bs:
            weights = weights.copy()
            weights[real:] = 0.0
        t, c = _nll_sum_split(graphdef, params, inputs, targets, weights, lengths)
        total, count = total + float(t), count + float(c)
    if count == 0:
        raise ValueError("evaluate: no loss-masked tokens in the rows")
    return total / count


def evaluate_loss(model, conversations: Sequence, pad_id: int = 0, config: SFTConfig | None = None) -> float:
    """Exact masked token-mean NLL of `model` on the conversations (no training)."""
    cfg = config or SFTConfig(progress=False)
    graphdef, params = nnx.split(model, nnx.Param)
    return _evaluate(graphdef, params, build_rows(conversations, pad_id, cfg.max_len), cfg)


def length_grouped_order(lengths: np.ndarray, batch_size: int, rng: np.random.Generator,
                          window_batches: int = 16) -> np.ndarray:
    """An epoch's row order whose consecutive batches hold rows of similar length.

    Shuffle, sort each window of `window_batches` batches by length, cut it into batches, then
    shuffle the batches: each batch pads to a smaller bucket while the data order stays random
    at the scale of a window (the usual group-by-length sampler).
    """
    perm = rng.permutation(len(lengths))
    w = batch_size * window_batches
    windows = [perm[i:i + w][np.argsort(lengths[perm[i:i + w]], kind="stable")] for i in range(0, len(perm), w)]
    flat = np.concatenate(windows)
    batches = [flat[i:i + batch_size] for i in range(0, len(flat), batch_size)]
    return np.concatenate([batches[i] for i in rng.permutation(len(batches))])


def sft_train(model, conversations: Sequence, config: SFTConfig, pad_id: int = 0,
              optim: OptimConfig | None = None, seconds: float | None = None, tied_rows=None,
              min_steps: int = 0):
    """Train `model` on the conversations; returns (trained model, per-step history dicts).

    Batches are drawn by reshuffling the rows each epoch (seeded), grouped by length so a batch
    (padded to the bucket of its longest row) wastes little on padding; no row is skipped: the
    first ceil(rows / batch_size) steps see each row at least once. optim: the optimizer's
    settings (default: `optim_config(config)`); seconds: stop once this much wall clock has
    passed (config.steps still bounds the run), but not before `min_steps` steps; tied_rows: groups
    of embedding rows that move together (`SFTTrainer`).
    """
    rows = build_rows(conversations, pad_id, config.max_len)
    if rows.weights.sum() == 0:
        raise ValueError("sft_train: the conversations have no loss-masked tokens")
    trainer = SFTTrainer(model, config, tied_rows=tied_rows, optim=optim)
    rng = np.random.default_rng(config.seed)
    t0 = time.perf_counter()
    bs = config.batch_size
    order, pos = length_grouped_order(rows.lengths, bs, rng), 0
    history = []
    bar = None
    if config.progress:
        bar = tqdm(total=config.steps, desc="sft", leave=False)
    try:
        for step in range(config.steps):
            if seconds is not None and step >= min_steps and time.perf_counter() - t0 >= seconds:
                break
            # The epochs as one stream: an epoch's last rows (fewer than a batch), or all of them when a
            # batch holds more, open a batch the next epoch fills, so the first ceil(n / bs) steps see every row.
            while pos + bs > len(order):
                order, pos = np.concatenate([order[pos:], length_grouped_order(rows.lengths, bs, rng)]), 0
            idx = order[pos:pos + bs]
            pos += bs
            stats = trainer.train_step(rows, idx)
            stats["step"] = step
            history.append(stats)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{stats['loss']:.3f}", L=stats["length"])
    finally:  # a Ctrl-C too: the bar is cleared, so the interrupt's message starts its own line
        if bar is not None:
            bar.close()
    return trainer.model(), history
