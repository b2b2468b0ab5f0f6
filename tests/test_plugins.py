"""Config-driven extension points: the reward plugin, dynamic sampling (group filter), the tool
registry and the observation token cap."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from memsearcher_jax.agent.parsing import parse_tool_calls, parse_tool_calls_detailed
from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.agent.tools import SearchTool, ToolConfigError, tool_from_config
from memsearcher_jax.rl.advantages import groups_with_spread
from memsearcher_jax.settings import load_settings
from tests.test_rollout import SEARCH, Docs, FixedSampler, Q
from tests.test_train_step import ROOT, SMALL

REWARDS = '''
from memsearcher_jax.qa_metrics import RewardResult
def constant(blocks, ended_with_eos, golds):
    return RewardResult(reward=0.5, answer="", em=0.0, f1=0.0, format_ok=True, failure=None)
'''


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from tests.assets import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir())


def test_groups_with_spread():
    keep = groups_with_spread([0.1, 0.1, 0.5, 0.3, 1.0, 1.0, 0.7], [0, 0, 1, 1, 2, 2, 3])
    assert keep.tolist() == [False, False, True, True, False, False, False]  # ties and a group of one drop


def test_reward_plugin_from_a_file_and_bad_specs(tmp_path):
    from memsearcher_jax.app.experiment import TrainConfigError, load_reward_fn
    from memsearcher_jax.qa_metrics import compute_reward

    (tmp_path / "my_rewards.py").write_text(REWARDS)
    fn = load_reward_fn(f"{tmp_path / 'my_rewards.py'}:constant")
    assert fn(["x"], True, ["y"]).reward == 0.5
    assert load_reward_fn("") is compute_reward
    assert load_reward_fn("memsearcher_jax.qa_metrics:compute_reward") is compute_reward
    for bad, match in (("nomodule_xyz:f", "cannot load"), ("memsearcher_jax.qa_metrics:nope", "no callable"),
                       ("justaname", "expected 'module:function'")):
        with pytest.raises(TrainConfigError, match=match):
            load_reward_fn(bad)


@pytest.mark.slow
def test_zero_std_filter_drops_tied_groups_and_refills(tmp_path):
    from memsearcher_jax.app.experiment import build_trainer

    (tmp_path / "my_rewards.py").write_text(REWARDS)
    base = SMALL + [("world.cache_dir", str(tmp_path / "w")), ("train.output_dir", str(tmp_path / "run"))]
    cfg = load_settings(os.path.join(ROOT, "configs/default.py"), base + [
        ("rl.reward_fn", f"{tmp_path / 'my_rewards.py'}:constant"), ("rl.filter_groups", "zero_std"),
        ("rl.max_refill", "2")])
    trainer = build_trainer(cfg, progress=False)
    calls = []
    run = trainer.runner.run
    trainer.runner.run = lambda qs, **kw: calls.append(len(qs)) or run(qs, **kw)
    m = trainer.train_step()
    # Every group ties under a constant reward: all 4 dropped, 2 refill rounds of 4 more questions each.
    assert m["filtered_groups"] == 4 and m["refill_rounds"] == 2 and calls == [4, 4, 4]
    assert m["reward_mean"] == 0.5
    cfg = load_settings(os.path.join(ROOT, "configs/default.py"), base + [("rl.filter_groups", "zero_std")])
    assert build_trainer(cfg, progress=False).loop.max_refill == 2


def test_a_custom_tool_from_a_schema_reaches_prompt_and_parser(tok):
    schema = {"type": "function", "function": {"name": "kb_lookup", "description": "Look up the knowledge base.",
                                               "parameters": {"type": "object", "properties": {
                                                   "text": {"type": "string"}, "k": {"type": "integer"}},
                                                   "required": ["text"]}}}
    tool = tool_from_config("ignored", json.dumps(schema))
    assert (tool.name, tool.query_arg, tool.top_n_arg) == ("kb_lookup", "text", "k")
    assert tool_from_config("kb_lookup") is tool  # registered by name from now on
    b = PromptBuilder(tok, default_top_n=3, tool=tool)
    assert "kb_lookup" in b.decode(b.memsearcher_context("q")) and "wikipedia_search" not in b.decode(
        b.memsearcher_context("q"))
    text = '<think>x</think>' + tool.call_text("capital of France", 2)
    (call,) = parse_tool_calls(text, tool=tool)
    assert call.query == "capital of France" and call.top_n == 2
    wrong = parse_tool_calls_detailed('<tool_call>{"name": "wikipedia_search", "arguments": {"query": "q"}}'
                                      '</tool_call>', tool=tool)
    assert not wrong.calls and "expected 'kb_lookup'" in wrong.malformed[0].reason
    with pytest.raises(ToolConfigError, match="not a registered tool"):
        tool_from_config("no_such_tool")
    with pytest.raises(ToolConfigError, match="no required string parameter"):
        SearchTool.from_schema({"name": "t", "parameters": {"properties": {"k": {"type": "integer"}}}})


def test_observation_cap_cuts_documents_and_keeps_the_episode_going(tok):
    b = PromptBuilder(tok)

    class LongDocs(Docs):
        def search(self, queries, top_n):
            return [[self._hit(q, i) for i in range(top_n)] for q in queries]

        def _hit(self, q, i):
            from retrieval.base import Hit

            return Hit(f"d{i}", f"Doc about {q}\n" + "The answer is Paris. " * 200)

    update = lambda i: "<memory>Paris</memory>"
    answer_after_search = lambda i: SEARCH if i == 1 else "ok</think>\n\\boxed{Paris}"
    for cap, budget in ((0, 600), (160, 600)):
        runner = AgentRunner(b, FixedSampler(tok, b, answer_after_search, update), LongDocs(),
                             AgentConfig(max_turns=3, max_response_tokens=budget, max_observation_tokens=cap))
        (t,) = runner.run(Q)
        if cap == 0:
            assert t.end_reason == "response_budget"  # 3 passages x ~1000 tokens overflow the response
        else:
            assert t.end_reason == "answer"
            obs = [tid for tid, m in zip(t.conversations[0].response_ids, t.conversations[0].loss_mask) if m == 0]
            # The cap holds the whole observation, markup and the cut's note included (issue 82 item 13).
            assert "tokens]" in b.decode(obs).split("[truncated to ")[1] and len(obs) <= 160
    assert np.all(groups_with_spread([0.0, 1.0], [0, 0]))
