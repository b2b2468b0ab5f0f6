"""Issue 83's settings (question schedule, turn budget per count, hint line, weighting modes) are off by
default, and off they change nothing: the demonstrator's rows, the rollout's rows, the packed rows,
their advantages and aggregation weights, and the data order are bit-identical to the code before
them (ac526df). The digests below were computed by this same file on a clean copy of that commit;
everything here is integers or float64/float32 arithmetic on the host, so the digests do not depend
on the machine. A change that moves a digest changes what a default run trains on: say so, then
recompute them."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.data.demos import DemoConfig, make_demonstrations
from memsearcher_jax.data.synthetic import join_objectives
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.world_cache import prepare_world
from memsearcher_jax.rl.batching import pack_rows
from memsearcher_jax.rl.grpo import trajectory_advantages
from memsearcher_jax.rl.losses import aggregation_weights
from memsearcher_jax.rl.trainer import batch_for_step
from memsearcher_jax.runtime.jsonl import read_jsonl
from retrieval.bm25 import BM25Retriever

WORKFLOWS = ("memsearcher", "react", "mem1", "memory_ops")
OLD_MODES = ("token_mean", "trajectory_mean", "microbatch_token_mean")
# Computed at ac526df (before issue 83's settings) by this file's helpers.
DIGESTS = {
    "demos": "7708e8fb91c7224129136aac9ea02b3fd8d76dcb0c2e30bf06df3c2f635ec6e6",
    "rollouts": "27cbdd456a8a5191d1edc295b1805121aac9486464c4e5e4ba27392a82f3a58c",
    "rows": "3e9abe5fa590c838fdc8d537cb7e0ff977677c2692334556129b0e788c5294c8",
    "order": "e88a4c032a7782f4dd81947eb6e6b33e81844e3b84d805ec44afe4b6ec976769",
}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _arrays_digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


@dataclasses.dataclass
class _Completion:
    tokens: list
    logprobs: list
    finish_reason: str = "stop"


class _Replay:
    """Answers a prompt with what a demonstration generated after exactly that prefix (tests/test_demos.py)."""

    def __init__(self, demos):
        self.table = {}
        for d in demos:
            for c in d.conversations:
                pos = 0
                while pos < len(c.loss_mask):
                    end = pos
                    while end < len(c.loss_mask) and c.loss_mask[end] == 1:
                        end += 1
                    if end > pos:
                        self.table[tuple(c.prompt_ids + c.response_ids[:pos])] = c.response_ids[pos:end]
                    pos = max(end, pos + 1)

    def generate(self, prompts, **kw):
        return [_Completion(list(self.table[tuple(p)]), [-0.25] * len(self.table[tuple(p)])) for p in prompts]


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    """For each workflow: its demonstrations of 1-, 2- and 3-question rows (flawed), and the same
    rows rolled out by AgentRunner replaying them under a 4-turn limit (some end at the limit)."""
    paths = prepare_world(str(tmp_path_factory.mktemp("world")), seed=5, num_entities=40)
    builder = PromptBuilder(load_tokenizer(paths.tokenizer_dir), style="compact", multi_answer=True)
    retriever = BM25Retriever.from_passages(read_jsonl(paths.corpus))
    train = read_jsonl(paths.train)
    rows = [r for n in (1, 2, 3) for r in join_objectives(train, n, seed=1)[:6]]
    flaws = DemoConfig(vague_query_rate=0.3, wrong_answer_rate=0.2, early_answer_rate=0.2, max_turns=8,
                       early_two_hop="first_hop", top_n=3)  # the demonstrator's defaults these digests were taken at
    out = {}
    for wf in WORKFLOWS:
        demos = make_demonstrations(rows, builder, retriever, seed=2, config=dataclasses.replace(flaws, workflow=wf))
        trajs = []
        for i, d in enumerate(demos):  # one runner call per row: questions repeat across rows
            agent = AgentConfig(workflow=wf, max_turns=4, max_context_tokens=32768, missing_top_n=0,
                                summary_budget=8192)
            runner = AgentRunner(builder, _Replay([d]), retriever, agent)
            trajs += runner.run([d.row], group_size=1, seed=0, first_group_id=i // 2, first_traj_id=i)
        out[wf] = (demos, trajs)
    return out, train


def _conversations(trajs):
    return [[c.prompt_ids, c.response_ids, c.loss_mask, c.sampler_logprobs, c.turn, c.is_final, c.blocks]
            for t in trajs for c in t.conversations]


def test_demonstrations_are_unchanged(episodes):
    eps, _ = episodes
    got = {wf: [_conversations([d.trajectory]) + [d.memories, d.answer, d.flaw] for d in demos]
           for wf, (demos, _) in eps.items()}
    assert _digest(got) == DIGESTS["demos"]


def test_rollouts_are_unchanged(episodes):
    eps, _ = episodes
    got = {wf: [_conversations(trajs), [[t.end_reason, t.num_searches, t.memories, t.context_tokens] for t in trajs]]
           for wf, (_, trajs) in eps.items()}
    assert _digest(got) == DIGESTS["rollouts"]


def test_rows_advantages_and_weights_are_unchanged(episodes):
    eps, _ = episodes
    arrays = []
    for wf in WORKFLOWS:
        trajs = eps[wf][1]
        rewards = [((t.traj_id * 7) % 5) / 4 for t in trajs]
        adv = trajectory_advantages(trajs, rewards)
        rows = pack_rows(trajs, adv, pad_id=0, min_len=16)
        mb = np.arange(rows.num_rows) % 3
        arrays += [adv, rows.tokens, rows.loss_mask, rows.advantages, rows.traj_ids, rows.group_ids, rows.turns]
        for mode in OLD_MODES:
            w, denom = aggregation_weights(mode, rows.loss_mask, rows.traj_ids, mb, 3)
            arrays += [w, np.float64(denom)]
    assert _arrays_digest(arrays) == DIGESTS["rows"]


def test_data_order_is_unchanged(episodes):
    _, train = episodes
    order = [[q["id"] for q in batch_for_step(train, step, 7, seed)[0]] for seed in (0, 3) for step in range(12)]
    assert _digest(order) == DIGESTS["order"]
