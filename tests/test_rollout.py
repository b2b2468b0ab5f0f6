"""The turn loop's episode endings, the memory budget, the ReAct baseline and search failures."""
from __future__ import annotations

import dataclasses

import pytest

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.rl.grpo import score_trajectories
from retrieval.base import Hit


@dataclasses.dataclass
class Out:
    tokens: list
    logprobs: list
    finish_reason: str


class FixedSampler:
    """act_text / update_text are functions of the call index; the reply ends with <|im_end|>."""

    def __init__(self, tok, b, act, update, finish="stop"):
        self.tok, self.b, self.act, self.update, self.finish = tok, b, act, update, finish
        self.calls = []

    def generate(self, prompts, *, max_new_tokens, **kw):
        self.calls.append((len(prompts), max_new_tokens))
        outs = []
        for p in prompts:
            is_act = p[-1] == self.b.think_id
            text = self.act(len(self.calls)) if is_act else self.update(len(self.calls))
            ids = self.tok.encode(text, add_special_tokens=False)
            if self.finish == "stop":
                ids = ids + [self.b.eos_id]
            outs.append(Out(ids, [-1.0] * len(ids), self.finish))
        return outs


class Docs:
    def __init__(self, fail=False):
        self.fail, self.queries = fail, []

    def search(self, queries, top_n):
        self.queries.append(list(queries))
        if self.fail:
            raise ConnectionError("retriever down")
        return [[Hit(f"d{i}", f"Doc about {q}\nThe answer is Paris.") for i in range(top_n)] for q in queries]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from tests.assets import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir())


SEARCH = 'x</think>\n<tool_call>{"name": "wikipedia_search", "arguments": {"query": "capital", "top_n": 3}}</tool_call>'
Q = [{"question": "What is the capital?", "golden_answers": ["Paris"]}]


def test_memory_budget_is_enforced(tok):
    b = PromptBuilder(tok)
    long_memory = "<memory>" + "word " * 40 + "</memory>"
    runner = AgentRunner(b, FixedSampler(tok, b, lambda i: SEARCH, lambda i: long_memory), Docs(),
                         AgentConfig(memory_budget=30, max_new_tokens=200))
    (t,) = runner.run(Q)
    assert t.end_reason == "memory_over_budget" and len(t.conversations) == 1 and t.memories == []
    runner.config = AgentConfig(memory_budget=60, max_new_tokens=200, max_turns=2)
    (t,) = runner.run(Q)
    assert t.end_reason == "max_turns" and len(t.memories) == 2
    # The memory is carried into the next context, re-tokenized once.
    assert b.memsearcher_context(Q[0]["question"], t.memories[0]) == t.conversations[1].prompt_ids


def test_endings_and_rewards(tok):
    b = PromptBuilder(tok)
    cases = {
        "answer": (lambda i: "ok</think>\n\\boxed{Paris}", "stop", 1.0),
        "invalid_act": (lambda i: "I do not know</think> nothing", "stop", 0.0),
        "length": (lambda i: "thinking forever", "length", 0.0),
    }
    for reason, (act, finish, reward) in cases.items():
        sampler = FixedSampler(tok, b, act, lambda i: "<memory>m</memory>", finish=finish)
        (t,) = AgentRunner(b, sampler, Docs(), AgentConfig(max_new_tokens=50)).run(Q)
        assert t.end_reason == reason
        assert score_trajectories([t])[0].reward == reward
    no_memory = FixedSampler(tok, b, lambda i: SEARCH, lambda i: "I forgot the tags")
    (t,) = AgentRunner(b, no_memory, Docs(), AgentConfig()).run(Q)
    assert t.end_reason == "no_memory"


def test_search_failure_becomes_the_observation(tok):
    b = PromptBuilder(tok)
    sampler = FixedSampler(tok, b, lambda i: SEARCH if i == 1 else "ok</think>\n\\boxed{Paris}",
                           lambda i: "<memory>nothing found</memory>")
    runner = AgentRunner(b, sampler, Docs(fail=True), AgentConfig())
    runner.stats.max_search_error_fraction = 1.0  # keep going: this test reads the error observation
    (t,) = runner.run(Q)
    assert t.end_reason == "answer" and runner.stats.search_errors == 1
    obs = [tk for tk, m in zip(t.conversations[0].response_ids, t.conversations[0].loss_mask) if m == 0]
    assert "retriever down" in tok.decode(obs)


def test_react_keeps_one_growing_conversation_with_masked_documents(tok):
    b = PromptBuilder(tok)
    sampler = FixedSampler(tok, b, lambda i: SEARCH if i < 3 else "ok</think>\n\\boxed{Paris}", lambda i: "")
    docs = Docs()
    runner = AgentRunner(b, sampler, docs, AgentConfig(workflow="react", max_turns=5))
    trajs = runner.run(Q * 2, group_size=2)
    assert len(trajs) == 4 and all(t.end_reason == "answer" for t in trajs)
    assert [len(q) for q in docs.queries] == [4, 4]  # one batched search per turn for all rows
    for t in trajs:
        assert len(t.conversations) == 1 and t.final.is_final
        c = t.final
        # Context grows every turn by the previous act and the documents.
        assert t.context_tokens == sorted(t.context_tokens) and len(set(t.context_tokens)) == 3
        masked = tok.decode([tk for tk, m in zip(c.response_ids, c.loss_mask) if m == 0])
        generated = tok.decode([tk for tk, m in zip(c.response_ids, c.loss_mask) if m == 1])
        assert masked.count("The answer is Paris.") == 6 and "The answer is Paris." not in generated
        assert generated.count("<|im_end|>") == 3
    assert score_trajectories(trajs)[0].reward == 1.0


def test_per_row_budgets_respect_the_response_budget(tok):
    b = PromptBuilder(tok)
    sampler = FixedSampler(tok, b, lambda i: SEARCH, lambda i: "<memory>m</memory>")
    cfg = AgentConfig(max_new_tokens=100, max_response_tokens=60)
    (t,) = AgentRunner(b, sampler, Docs(), cfg).run(Q)
    # The observation leaves no room for the memory update within 60 response tokens.
    assert t.end_reason == "response_budget"
    assert sampler.calls[0][1] == [60]


class CountingDocs(Docs):
    def search(self, queries, top_n):
        self.top_ns = getattr(self, "top_ns", []) + [top_n]
        return super().search(queries, top_n)


@pytest.mark.parametrize("missing, expected", [(0, 5), (10, 10)])
def test_call_without_top_n_gets_missing_top_n(tok, missing, expected):
    b = PromptBuilder(tok)
    no_top_n = 'x</think>\n<tool_call>{"name": "wikipedia_search", "arguments": {"query": "capital"}}</tool_call>'
    docs = CountingDocs()
    runner = AgentRunner(b, FixedSampler(tok, b, lambda i: no_top_n, lambda i: "<memory>m</memory>"), docs,
                         AgentConfig(max_turns=1, default_top_n=5, max_top_n=10, missing_top_n=missing))
    runner.run(Q)
    assert docs.top_ns == [expected]


def test_tool_call_inside_a_later_think_span_is_not_run(tok):
    # classify_act and the search see the same text: calls outside every <think> span only.
    b = PromptBuilder(tok)
    act = SEARCH + ('<think>also <tool_call>{"name": "wikipedia_search", "arguments": {"query": "hidden"}}'
                    "</tool_call></think>")
    docs = Docs()
    runner = AgentRunner(b, FixedSampler(tok, b, lambda i: act, lambda i: "<memory>m</memory>"), docs,
                         AgentConfig(max_turns=1))
    (t,) = runner.run(Q)
    assert docs.queries == [["capital"]] and t.num_searches == 1


@pytest.mark.slow
def test_sampler_batch_size_chunks_calls_without_changing_samples(tok):
    import jax.numpy as jnp
    from flax import nnx

    from memsearcher_jax.models import ModelConfig, Qwen2
    from memsearcher_jax.sampling import Sampler

    class Spy:
        def __init__(self, sampler):
            self.sampler, self.sizes = sampler, []

        def generate(self, prompts, **kw):
            self.sizes.append(len(prompts))
            return self.sampler.generate(prompts, **kw)

    b = PromptBuilder(tok)
    model = Qwen2(ModelConfig.tiny(vocab_size=len(tok), num_layers=1), rngs=nnx.Rngs(3))
    sampler = Sampler(model, cache_dtype=jnp.float32)
    questions = [{"question": f"Where was person {i} born?", "golden_answers": ["x"]} for i in range(5)]
    runs = {}
    for chunk in (0, 3):
        spy = Spy(sampler)
        # Greedy: a random model's near-uniform distribution would let last-bit differences
        # between batch shapes pick a neighbouring token (seeds are tested in test_multihost.py).
        runner = AgentRunner(b, spy, Docs(), AgentConfig(max_turns=1, max_new_tokens=6, temperature=0.0,
                                                         sampler_batch_size=chunk))
        trajs = runner.run(questions, group_size=2, seed=4)
        runs[chunk] = [(c.response_ids, c.sampler_logprobs) for t in trajs for c in t.conversations]
        assert max(spy.sizes) == (10 if chunk == 0 else 3) and runner.stats.sampler_calls == len(spy.sizes)
    assert [r[0] for r in runs[0]] == [r[0] for r in runs[3]]
    assert max(abs(a - b) for x, y in zip(runs[0], runs[3]) for a, b in zip(x[1], y[1])) < 1e-5


def _calls(*queries: str) -> str:
    return "x</think>\n" + "".join(
        f'<tool_call>{{"name": "wikipedia_search", "arguments": {{"query": "{q}", "top_n": 1}}}}</tool_call>'
        for q in queries)


@pytest.mark.parametrize("workflow", ["memsearcher", "react", "mem1", "memory_ops"])
def test_searches_beyond_the_cap_are_refused_with_a_note(tok, workflow):
    """Issue 82 item 13: an act may not issue any number of searches. The first
    agent.max_searches_per_act run; the rest get one short refusal in the observation and no search."""
    b = PromptBuilder(tok)
    five = _calls("q1", "q2", "q3", "q4", "q5")
    sampler = FixedSampler(tok, b, lambda i: five if i == 1 else "ok</think>\n\\boxed{Paris}",
                           lambda i: "<memory>m</memory>" if workflow == "memsearcher" else "<ops>\nNOOP\n</ops>")
    docs = Docs()
    runner = AgentRunner(b, sampler, docs, AgentConfig(workflow=workflow, max_turns=2, max_searches_per_act=2))
    (t,) = runner.run(Q)
    assert docs.queries == [["q1", "q2"]], "only the first max_searches_per_act calls are searched"
    assert t.num_searches == 2 and t.refused_searches == 3 and runner.stats.refused_searches == 3
    ids = (t.state["last_observation"] if workflow == "mem1"
           else [tk for tk, m in zip(t.conversations[0].response_ids, t.conversations[0].loss_mask) if m == 0])
    obs = tok.decode(ids)
    assert obs.count("Doc about q") == 2 and "q3" not in obs
    assert "3 more searches refused: at most 2 searches per turn" in obs
    assert obs.count("<tool_response>") == 3  # the two searches' responses and the one refusal
    assert t.end_reason == "answer"
