"""A step's training batch, built from the config and the vocabulary alone (rows depend only on
(seed, step)), on a thread or in worker processes ahead of the trainer."""
from __future__ import annotations

import collections
import multiprocessing
import queue
import signal
import threading

import jax
import ml_collections

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.vocab import ReadingVocab
from memsearcher_jax.pretrain.curriculum import Curriculum, PhasedCurriculum
from memsearcher_jax.pretrain.phases import phase_list
from memsearcher_jax.rl.sft import SFTConfig, build_rows, pack_rows


class _Prefetch:
    """Builds the next step's rows on a thread while the current step trains."""

    def __init__(self, make, start: int, stop: int):
        self.q: queue.Queue = queue.Queue(maxsize=2)
        self.thread = threading.Thread(target=self._run, args=(make, start, stop), daemon=True)
        self.thread.start()

    def _run(self, make, start, stop):
        for step in range(start, stop):
            try:
                self.q.put((step, make(step)))
            except Exception as e:  # handed to the trainer, which raises it (else it would wait forever)
                self.q.put((step, e))
                return

    def get(self):
        step, got = self.q.get()
        if isinstance(got, Exception):
            raise got
        return step, got

    def close(self):
        pass


def sft_config(cfg: ml_collections.ConfigDict) -> SFTConfig:
    """The trainer's settings from cfg.train (also the row buckets `BatchMaker` packs to), its
    max_len and batch size the largest of any phase (the optimizer is `phases.optim_config`'s)."""
    t, phases = cfg.train, phase_list(cfg)
    return SFTConfig(steps=t.steps, batch_size=max(p.batch_size for p in phases), lr=t.learning_rate, seed=t.seed,
                     warmup=min(t.warmup, t.steps), max_len=max(p.curriculum.max_len for p in phases),
                     min_len=t.min_len, progress=False)


class BatchMaker:
    """A step's training batch from the config and the vocabulary alone. Rows depend only on
    (seed, step), so any process builds the same batch for the same step: worker processes can
    build steps ahead of the trainer (`train.data_workers`) without changing a single row."""

    def __init__(self, cfg: ml_collections.ConfigDict, vocab_dir: str):
        vocab = ReadingVocab.load(vocab_dir)
        self.builder = PromptBuilder(load_tokenizer(vocab_dir), default_top_n=cfg.curriculum.top_n, style="compact")
        self.phases = phase_list(cfg)
        self.curriculum = PhasedCurriculum([(p.start, Curriculum(vocab, self.builder, p.curriculum))
                                            for p in self.phases])
        t = cfg.train
        self.sft_cfg = sft_config(cfg)
        self.pack = t.pack
        self.full_width = bool(t.get("pack_to_max_len", False))

    def __call__(self, step: int):
        phase = [p for p in self.phases if p.start <= step][-1]
        cur = phase.curriculum
        rows = self.curriculum.rows_for_step(step, phase.batch_size)
        if self.pack:  # several rows per sequence: the same loss, less padding
            longest = max(len(r.prompt_ids) + len(r.response_ids) - 1 for r in rows)
            # As wide as the step's longest row needs (its bucket), not always max_len: a short-row
            # step packed into max_len-wide rows would pay attention over max_len for nothing. On an
            # accelerator that work is cheap and each other width is another program to compile:
            # `train.pack_to_max_len` packs every step of a phase to its max_len.
            width = cur.max_len if self.full_width else min(cur.max_len, self.sft_cfg.bucket_for(longest))
            return pack_rows(rows, self.builder.pad_id, width)
        return build_rows(rows, self.builder.pad_id, self.sft_cfg.max_len)


_WORKER_MAKER: BatchMaker | None = None


def _worker_start(cfg_dict: dict, vocab_dir: str) -> None:
    global _WORKER_MAKER
    # Ctrl-C (or `timeout --signal=INT`) reaches the whole process group: the trainer handles it
    # and stops the pool; a worker that took it too would only print its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    jax.config.update("jax_platforms", "cpu")  # a data worker never touches the accelerator
    _WORKER_MAKER = BatchMaker(ml_collections.ConfigDict(cfg_dict), vocab_dir)


def _worker_batch(step: int):
    return step, _WORKER_MAKER(step)


class _PoolPrefetch:
    """Builds steps ahead in `workers` processes (fresh interpreters: the trainer's JAX state is
    not forked), at most 2 x workers steps ahead, handed back in step order."""

    def __init__(self, cfg: ml_collections.ConfigDict, vocab_dir: str, start: int, stop: int, workers: int):
        self.pool = multiprocessing.get_context("spawn").Pool(workers, _worker_start, (cfg.to_dict(), vocab_dir))
        self.pending: collections.deque = collections.deque()
        self.next, self.stop, self.ahead = start, stop, 2 * workers
        self._fill()

    def _fill(self):
        while self.next < self.stop and len(self.pending) < self.ahead:
            self.pending.append(self.pool.apply_async(_worker_batch, (self.next,)))
            self.next += 1

    def get(self):
        got = self.pending.popleft().get()
        self._fill()
        return got

    def close(self):
        self.pool.terminate()
