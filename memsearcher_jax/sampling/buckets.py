"""Shape buckets: round batch size, prompt length and token budget up to a few sizes,
so a whole training run compiles a small, bounded number of sampler programs.

Pure Python; unit-tested on their own.
"""
from __future__ import annotations

import dataclasses


def bucket(n: int, minimum: int = 1, steps_per_octave: int = 1, multiple_of: int = 1) -> int:
    """The smallest bucket size >= max(n, minimum).

    Buckets are powers of two, optionally split into `steps_per_octave` equal steps
    (2 -> 16, 24, 32, 48, 64, ...; padding waste <= 1/steps_per_octave), then rounded up
    to a multiple of `multiple_of` (e.g. the number of batch shards of a mesh).
    """
    if n < 0:
        raise ValueError(f"bucket size request must be >= 0, got {n}")
    if minimum < 1 or steps_per_octave < 1 or multiple_of < 1:
        raise ValueError(f"bucket minimum, steps_per_octave and multiple_of must be >= 1, got "
                         f"{minimum}, {steps_per_octave}, {multiple_of}")
    n = max(n, minimum)
    p = 1
    while p < n:
        p *= 2
    size = p
    if steps_per_octave > 1 and p >= 2 * steps_per_octave:
        # Steps of p / (2 * steps) inside the octave (p/2, p].
        step = p // (2 * steps_per_octave)
        size = -(-n // step) * step
    return -(-size // multiple_of) * multiple_of


@dataclasses.dataclass(frozen=True)
class BucketConfig:
    """Minimum bucket sizes and granularity of each bucketed dimension.

    min_shared_prefix: the shared-prefix path (prefill the common prefix once, at batch 1)
    is taken only when the batch's common prefix has at least this many tokens.
    """

    min_batch: int = 1
    min_prompt: int = 16
    min_new_tokens: int = 16
    prompt_steps_per_octave: int = 2
    new_tokens_steps_per_octave: int = 1
    min_shared_prefix: int = 32

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"BucketConfig.{f.name} must be >= 1, got {getattr(self, f.name)}")

    @classmethod
    def for_turn_loop(cls, max_new_tokens: int) -> BucketConfig:
        """Coarse buckets for an agent's turn loop, so a training run meets all its sampler programs
        in its first steps: its calls range from every row (turn 0) down to a few stragglers and
        memory updates, over prompts that grow turn by turn. Batches and prefill-grid rows from 8
        (5 sizes up to 128 instead of 8; a padding row costs little in decode, which reads the
        weights once per step for all rows), prompt suffixes in whole octaves from 64 (a wider grid
        row packs more suffixes, so few padding tokens), and every budget up to max_new_tokens in
        one bucket (the decode loop stops at the largest real budget, so a larger buffer is free)."""
        return cls(min_batch=8, min_prompt=64, prompt_steps_per_octave=1, min_new_tokens=max(16, max_new_tokens))

    def batch(self, n: int, multiple_of: int = 1) -> int:
        return bucket(n, self.min_batch, 1, multiple_of)

    def prompt(self, n: int) -> int:
        return bucket(n, self.min_prompt, self.prompt_steps_per_octave)

    def new_tokens(self, n: int) -> int:
        return bucket(n, self.min_new_tokens, self.new_tokens_steps_per_octave)


def common_prefix_length(prompts: list[list[int]]) -> int:
    """Length of the longest prefix shared by every prompt."""
    if not prompts:
        return 0
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for other in prompts[1:]:
        i = 0
        while i < n and other[i] == first[i]:
            i += 1
        n = i
        if n == 0:
            break
    return n
