"""Reference computations the sampler and the learner are checked against: the model's full
forward, jitted once per model structure and shape.

Run eagerly, a forward compiles every operation again for each new row length (a 2-layer model
on 8 rows of different lengths spent ~30 s there); one right-padded width and one jit keep it
to a single compile. Padding on the right changes nothing before it: the attention is causal.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memsearcher_jax.rl.grpo import token_logprobs_and_entropy

WIDTH = 64  # every row a test checks this way is shorter


@nnx.jit
def forward(model, ids, attention_mask=None, positions=None, segment_ids=None):
    """The model's logits, jitted (one compile per model structure and shapes)."""
    return model(ids, positions=positions, attention_mask=attention_mask, segment_ids=segment_ids)


@nnx.jit
def _log_probs(model, ids, mask, temperature):
    return jax.nn.log_softmax(model(ids, attention_mask=mask)[0] / temperature, axis=-1)


def row_log_probs(model, ids: list[int], temperature: float = 1.0) -> np.ndarray:
    """log_softmax of the logits / temperature [len(ids), V] of one full forward over `ids`, with
    the model's current weights."""
    if len(ids) > WIDTH:
        raise ValueError(f"row of {len(ids)} tokens is longer than the reference width {WIDTH}")
    padded = np.zeros((1, WIDTH), np.int32)
    padded[0, :len(ids)] = ids
    mask = np.arange(WIDTH)[None] < len(ids)
    return np.asarray(_log_probs(model, jnp.asarray(padded), jnp.asarray(mask), jnp.float32(temperature)))[:len(ids)]


def full_logprobs(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> np.ndarray:
    """log_softmax(logits / temperature) of one full forward over prompt + tokens, at the tokens."""
    lp = row_log_probs(model, list(prompt) + list(tokens), temperature)
    return lp[np.arange(len(prompt) - 1, len(prompt) + len(tokens) - 1), np.asarray(tokens)]


@nnx.jit
def token_logprobs(model, tokens, attention):
    """The learner's per-token log-probs [B, S] over the full width (`token_logprobs_and_entropy`),
    jitted."""
    return token_logprobs_and_entropy(model, tokens, attention)[0]
