"""Compile counting (compile_stats), the persistent compilation cache, and the shape buckets
that let a run meet all its programs early."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memsearcher_jax.runtime import compile_stats
from memsearcher_jax.runtime.compile_stats import step_compiles

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_counts_a_new_program_and_nothing_when_it_is_reused():
    fn = jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)
    x, y = jnp.arange(7, dtype=jnp.float32), jnp.ones(7, jnp.float32)
    z = jnp.arange(9, dtype=jnp.float32)
    before = compile_stats.snapshot()
    fn(x).block_until_ready()
    first = compile_stats.snapshot() - before
    assert first.programs == 1 and first.seconds > 0
    before = compile_stats.snapshot()
    fn(y).block_until_ready()  # same shapes: the compiled program is reused
    assert (compile_stats.snapshot() - before).programs == 0
    before = compile_stats.snapshot()
    fn(z).block_until_ready()  # a new shape is a new program
    assert (compile_stats.snapshot() - before).programs == 1


def test_step_compiles_splits_phases():
    got = step_compiles(compile_stats.CompileCount(9, 2, 2.5), logprobs=2, update=3)
    assert got["compiles"] == 9 and got["compiles_sampler"] == 4 and got["compiles_logprobs"] == 2
    assert got["compiles_update"] == 3 and got["compiles_from_cache"] == 2
    assert got["compile_seconds"] == pytest.approx(2.5)


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_stats.CACHE_DIR_ENV, raising=False)
    assert compile_stats.resolve_cache_dir(None).endswith("memsearcher-jax/xla-cache")
    assert compile_stats.resolve_cache_dir("") == ""
    assert compile_stats.resolve_cache_dir(str(tmp_path)) == str(tmp_path)
    monkeypatch.setenv(compile_stats.CACHE_DIR_ENV, "")
    assert compile_stats.resolve_cache_dir(str(tmp_path)) == ""  # the variable wins, "" disables


_CHILD = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from memsearcher_jax.runtime import compile_stats
    compile_stats.enable_persistent_cache(sys.argv[1])
    before = compile_stats.snapshot()
    f = jax.jit(lambda x: jnp.tanh(x @ x.T) + 2.5)
    f(np.ones((5, 3), np.float32)).block_until_ready()  # numpy input: no eager program
    d = compile_stats.snapshot() - before
    print("COUNT", d.programs, d.from_cache)
""")


def _child(cache_dir: str) -> tuple[int, int]:
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
    env.pop(compile_stats.CACHE_DIR_ENV, None)
    out = subprocess.run([sys.executable, "-c", _CHILD, cache_dir], env=env, capture_output=True, text=True,
                         check=True).stdout
    line = [x for x in out.splitlines() if x.startswith("COUNT")][-1]
    return int(line.split()[1]), int(line.split()[2])


def test_a_second_process_loads_the_program_from_the_persistent_cache(tmp_path):
    cache = str(tmp_path / "xla")
    assert _child(cache) == (1, 0)  # first process: compiled by XLA
    assert os.listdir(cache), "the first process wrote nothing to the cache"
    assert _child(cache) == (1, 1)  # second process: the same program, loaded from the cache
    assert _child("") == (1, 0)  # disabled: compiled again



@pytest.mark.parametrize("packed", [False, True])
def test_the_update_compiles_once_whatever_the_number_of_micro_batches(packed):
    # Rows per step vary with the turns the agent took; the learner's programs must not (unpacked:
    # one shape; packed: the last block's rows take half-octave sizes up to the cap, a handful of
    # shapes, so after those have been seen no row count compiles anything new).
    from flax import nnx

    from memsearcher_jax.models import ModelConfig, Qwen2
    from memsearcher_jax.rl.batching import RowBatch
    from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig

    def rows(n, s=16, seed=0):
        rng = np.random.default_rng(seed)
        tokens = rng.integers(1, 64, (n, s)).astype(np.int32)
        mask = np.zeros((n, s), np.float32)
        mask[:, s // 2:] = 1
        return RowBatch(tokens=tokens, attention=np.ones((n, s), np.int32), loss_mask=mask,
                        sampler_logp=np.zeros((n, s), np.float32), advantages=rng.normal(size=n).astype(np.float32),
                        traj_ids=np.arange(n), group_ids=np.arange(n) // 2, turns=np.zeros(n, int),
                        is_final=np.ones(n, bool))

    learner = GRPOLearner(Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(1)),
                          GRPOConfig(min_seq_len=64, optimizer_steps=2, micro_batch_size=2, logprob_batch_size=4,
                                     pack_rows=packed, optim=OptimConfig(learning_rate=1e-3)))
    first = compile_stats.snapshot()
    learner.train_on_rows(rows(6), np.random.default_rng(0))  # mini-batches of 3 rows: 2 micro-batches
    assert (compile_stats.snapshot() - first).programs > 0
    if packed:  # every last-block size (1..4 rows a log-prob pass, 1..2 an update) once
        for n in (1, 2, 3, 5, 7):
            learner.train_on_rows(rows(n, seed=n), np.random.default_rng(n))
    before = compile_stats.snapshot()
    m = learner.train_on_rows(rows(21, seed=1), np.random.default_rng(1))  # 11 rows: 6 micro-batches
    assert (compile_stats.snapshot() - before).programs == 0 and m["compiles_logprobs"] == 0


def test_turn_loop_buckets_take_few_shapes():
    from memsearcher_jax.sampling.buckets import BucketConfig

    bk = BucketConfig.for_turn_loop(64)
    assert {bk.batch(n) for n in range(1, 513)} == {8, 32, 128, 512}
    assert bk.batch(9) == 32 and bk.batch(32) == 32 and bk.batch(33) == 128
    assert bk.batch(9, multiple_of=6) == 36  # a mesh's batch shards still divide it
    assert {bk.prompt(n) for n in range(1, 4097)} == {64, 256, 1024, 4096}
    assert {bk.new_tokens(n) for n in range(1, 65)} == {64}  # every budget of the turn loop: one buffer
    assert BucketConfig.for_turn_loop(100).new_tokens(3) == 128
    # Capped at the octave of the context limit and of the most rows a call takes: the KV cache is
    # sized by the buckets, so a pod's 8K context or 256 rows are not padded 2x.
    pod = BucketConfig.for_turn_loop(64, max_prompt=8192, max_batch=256)
    assert [pod.prompt(n) for n in (1025, 4096, 4097, 9000)] == [4096, 4096, 8192, 16384]
    assert [pod.batch(n) for n in (9, 33, 129, 256, 300)] == [32, 128, 256, 256, 512]
    default = BucketConfig.for_turn_loop(64, max_prompt=1024, max_batch=80)  # the default run: unchanged
    assert {default.batch(n) for n in range(1, 81)} == {8, 32, 128}
    assert {default.prompt(n) for n in range(1, 1024)} == {64, 256, 1024}
    with pytest.raises(ValueError, match="batch_growth"):
        BucketConfig(batch_growth=3)
    with pytest.raises(ValueError, match="max_shared_prefix"):
        BucketConfig(max_shared_prefix=-1)


def test_prefill_layouts_of_the_turn_loop_take_one_prefix_shape():
    # Every (batch, prefix, suffix, grid rows) key a turn-loop call can reach. The grid's rows follow
    # from the batch, and the prefix takes one slot whatever the call: a lone straggler and a single
    # question's rows (sharing far more than the system prompt) included. The default run met new
    # programs at GRPO steps 9-29 (2026-11-24): batch 16, suffix 128 and 512, lone prompts with no
    # prefix at all.
    from memsearcher_jax.sampling.buckets import BucketConfig
    from memsearcher_jax.sampling.prefill_layout import layout_prefill

    bk = BucketConfig.for_turn_loop(64)
    rng = np.random.default_rng(0)
    system = rng.integers(5, 100, 40).tolist()
    keys = set()
    for n in list(range(1, 34)) + [47, 64, 65, 80, 100, 128]:
        for spread in (4, 60, 300):  # suffixes of like length (one per grid row) to very ragged (packed)
            for dup in (1, 5, 200):  # 5: turn 0, a group's G identical prompts; 200: one question's rows
                question = rng.integers(5, 100, 120).tolist() if dup == 200 else []
                tails = [rng.integers(5, 100, int(rng.integers(1, spread + 1))).tolist() for _ in range(-(-n // dup))]
                prompts = [system + question + t for t in tails for _ in range(dup)][:n]
                lay = layout_prefill(prompts, bk, 1, None, True, True)
                assert lay.grid_rows == lay.batch and lay.grid[0].shape == (lay.batch, lay.suffix_slots)
                keys.add((lay.batch, lay.prefix_slots, lay.suffix_slots, lay.grid_rows))
    assert {k[1] for k in keys} == {64}, keys  # one prefix shape, lone prompts included
    assert {k[0] for k in keys} == {8, 32, 128} and {k[2] for k in keys} <= {64, 256, 1024}
    # A prompt too short to hold min_shared_prefix shared tokens keeps no prefix.
    assert layout_prefill([[7] * 20], bk, 1, None, True, True).prefix_slots == 0


def test_learner_rows_take_a_few_widths():
    from flax import nnx

    from memsearcher_jax.models import ModelConfig, Qwen2
    from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner

    learner = GRPOLearner(Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(1)),
                          GRPOConfig(logprob_batch_size=16, min_seq_len=128, max_seq_len=1536))
    # Below the step's longest rows (packed `columns` wide), calls take whole octaves only.
    widths = {learner.row_width(np.array([1, n]), 1536) for n in range(1, 1537)}
    assert widths == {128, 256, 512, 1024, 1536}
    assert {learner.row_width(np.array([n]), 448) for n in range(1, 449)} == {128, 256, 448}
