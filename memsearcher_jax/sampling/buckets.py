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


def geometric(n: int, start: int, growth: int) -> int:
    """The smallest start * growth**k >= n (k >= 0)."""
    size = start
    while size < n:
        size *= growth
    return size


def coarse_bucket(n: int, start: int, octave, limit: int = 0, multiple_of: int = 1) -> int:
    """A 4x bucket (start * 4**k, rounded up to multiple_of) for n; with a limit, never past the
    octave bucket of the limit, and never below n's own octave bucket (`octave`: n -> its octave
    bucket, the finer rounding this one coarsens)."""
    own = octave(n)  # also refuses n < 0
    size = -(-geometric(n, start, 4) // multiple_of) * multiple_of
    return max(own, min(size, octave(limit))) if limit else size


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
    # Growth from one batch / prompt-suffix bucket to the next: 2 (octaves, finer with the steps
    # above) or 4 (8, 32, 128, ...: fewer programs, up to 4x padding). steps_per_octave applies
    # only to growth 2.
    batch_growth: int = 2
    prompt_growth: int = 2
    # 0: the shared prefix is split off only when several prompts share >= min_shared_prefix
    # tokens, in a bucket of its length. > 0: every call whose prompts share >= min_shared_prefix
    # tokens (a lone prompt shares all but its last) splits off at most this many, so the prefix
    # takes one shape whatever the call (the rest of a longer common prefix stays in the suffixes).
    max_shared_prefix: int = 0
    # > 0: a 4x prompt bucket is capped at the octave bucket of this size (the context limit: the
    # KV cache is sized by the bucket, so 4x padding of a long context would cost memory); a
    # prompt past it takes its own octave.
    max_prompt: int = 0
    # > 0: likewise for batches, capped at the octave of the most rows a call takes (a pod's 256
    # rows stay 256, not 512).
    max_batch: int = 0

    def __post_init__(self):
        optional = ("max_shared_prefix", "max_prompt", "max_batch")  # 0: off
        for f in dataclasses.fields(self):
            if f.name not in optional and getattr(self, f.name) < 1:
                raise ValueError(f"BucketConfig.{f.name} must be >= 1, got {getattr(self, f.name)}")
        for name in optional:
            if getattr(self, name) < 0:
                raise ValueError(f"BucketConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("batch_growth", "prompt_growth"):
            if getattr(self, name) not in (2, 4):
                raise ValueError(f"BucketConfig.{name} must be 2 or 4, got {getattr(self, name)}")

    @classmethod
    def for_turn_loop(cls, max_new_tokens: int, max_shared_prefix: int = 64, max_prompt: int = 0,
                      max_batch: int = 0) -> BucketConfig:
        """Coarse buckets for an agent's turn loop, so a training run meets all its sampler programs
        in its first steps, whatever its data: its calls range from every row (turn 0) down to a
        lone straggler, over prompts that grow turn by turn. Batches and prefill-grid rows 8, 32,
        128, 512 (a padding row costs little in decode, which reads the weights once per step for
        all rows); prompt suffixes 64, 256, 1024, 4096 (a wider grid row packs more suffixes);
        the shared prefix in one max_shared_prefix-token slot in every call, a lone prompt's
        included (the system prompt; a single question's rows share more, kept in the suffixes);
        every budget up to max_new_tokens in one bucket (the decode loop stops at the largest real
        budget, so a larger buffer is free). max_prompt (the context limit) and max_batch (the most
        rows of a call) cap the 4x buckets at their octave buckets. The default run met new programs at GRPO steps 9-29
        with octave buckets and a prefix only for several prompts (2026-11-24)."""
        return cls(min_batch=8, batch_growth=4, min_prompt=64, prompt_growth=4, prompt_steps_per_octave=1,
                   min_new_tokens=max(16, max_new_tokens), max_shared_prefix=max_shared_prefix,
                   max_prompt=max_prompt, max_batch=max_batch)

    def batch(self, n: int, multiple_of: int = 1) -> int:
        def octave(m):
            return bucket(m, self.min_batch, 1, multiple_of)
        if self.batch_growth == 4:
            return coarse_bucket(n, self.min_batch, octave, self.max_batch, multiple_of)
        return octave(n)

    def prompt(self, n: int) -> int:
        def octave(m):
            return bucket(m, self.min_prompt, self.prompt_steps_per_octave)
        if self.prompt_growth == 4:
            return coarse_bucket(n, self.min_prompt, octave, self.max_prompt)
        return octave(n)

    def prefix_tokens(self, shared: int) -> int:
        """How many of `shared` common prefix tokens go into the prefix slot (max_shared_prefix caps it)."""
        return min(shared, self.max_shared_prefix) if self.max_shared_prefix else shared

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
