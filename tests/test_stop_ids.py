"""The agent stops on every end-of-sequence id the model declares, not only <|im_end|>."""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import pytest
from flax import nnx

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
from memsearcher_jax.app.experiment import stop_token_ids
from memsearcher_jax.models import ModelConfig, Qwen2, save_pretrained
from memsearcher_jax.models.hf_io import eos_token_ids
from memsearcher_jax.rl.grpo import score_trajectories
from memsearcher_jax.sampling import Sampler
from memsearcher_jax.settings.config_utils import load_config
from tests.test_rollout import Docs, FixedSampler, Q

DEFAULT = os.path.join(os.path.dirname(__file__), "..", "configs", "default.py")


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from tests.assets import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir())


def _with_eos(model_dir: str, ids: list[int]) -> str:
    path = os.path.join(model_dir, "generation_config.json")
    with open(path) as f:
        gen = json.load(f)
    gen["eos_token_id"] = ids
    with open(path, "w") as f:
        json.dump(gen, f)
    return model_dir


def test_eos_token_ids_reads_int_and_list(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert eos_token_ids(tmp_path) == [7]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7, 9]}))
    assert eos_token_ids(tmp_path) == [5, 7, 9]


def test_config_override_wins_and_default_reads_model_dir(tmp_path, tok):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [11, 12]}))
    cfg = load_config(DEFAULT, [("model.source", str(tmp_path))])
    assert set(stop_token_ids(cfg, tok)) >= {11, 12}
    cfg = load_config(DEFAULT, [("model.source", str(tmp_path)), ("agent.stop_token_ids", "(42,)")])
    assert stop_token_ids(cfg, tok) == [42]
    with pytest.raises(ValueError, match="outside the tokenizer"):
        PromptBuilder(tok, stop_ids=[len(tok) + 5])


@pytest.mark.parametrize("which", [0, 1])
def test_turn_loop_stops_on_either_declared_eos(tmp_path, tok, which):
    """A tiny model's sampled act (fixed seed: the same tokens with and without the extra stop),
    with generation_config listing two eos ids: the act ends on the declared id (first or second
    in the list), is ended, and its loss mask covers the stop token and nothing after it."""
    model = Qwen2(ModelConfig.tiny(vocab_size=len(tok), num_layers=1), rngs=nnx.Rngs(5))
    plain = PromptBuilder(tok)
    sampler = Sampler(model, cache_dtype=jnp.float32)
    config = AgentConfig(max_turns=1, max_new_tokens=12, temperature=1.0, top_p=1.0)
    # Without extra stops, the act runs on: find a token it emits that is not at position 0 and
    # has not appeared before, and declare it an end-of-sequence id.
    (free,) = AgentRunner(plain, sampler, Docs(), config).run(Q, seed=3)
    act = free.conversations[0].response_ids
    assert plain.eos_id not in act and len(act) == 12
    k = next(i for i in range(1, len(act)) if act[i] not in act[:i])
    declared = [act[k], plain.eos_id] if which == 0 else [plain.eos_id, act[k]]
    model_dir = _with_eos(save_pretrained(model, str(tmp_path / "m")), declared)
    cfg = load_config(DEFAULT, [("model.source", model_dir)])
    builder = PromptBuilder(tok, stop_ids=stop_token_ids(cfg, tok))
    assert act[k] in builder.stop_ids
    (t,) = AgentRunner(builder, sampler, Docs(), config).run(Q, seed=3)
    conv = t.conversations[0]
    assert conv.response_ids == act[:k + 1]            # stopped on the declared id, nothing after
    assert conv.loss_mask == [1] * (k + 1)             # the stop token is trained, like <|im_end|>
    assert conv.ended_with_eos and t.end_reason != "length"


def test_endoftext_ending_is_an_ending(tok):
    """A response that ends on <|endoftext|> (declared eos) is parsed as it is: an answer."""
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    builder = PromptBuilder(tok, stop_ids=[eot])

    class EndsOnEndoftext(FixedSampler):
        def generate(self, prompts, *, max_new_tokens, **kw):
            assert eot in kw["stop_token_ids"]
            outs = super().generate(prompts, max_new_tokens=max_new_tokens, **kw)
            for o in outs:
                o.tokens[-1] = eot  # FixedSampler ends with <|im_end|>; end on <|endoftext|> instead
            return outs

    sampler = EndsOnEndoftext(tok, builder, lambda i: "ok</think>\n\\boxed{Paris}", lambda i: "")
    (t,) = AgentRunner(builder, sampler, Docs(), AgentConfig(max_turns=2)).run(Q)
    assert t.end_reason == "answer" and t.final.ended_with_eos
    (res,) = score_trajectories([t])
    assert res.reward == 1.0 and res.em == 1.0
    # Without the declared id, the same text is not an ending: a pad stop.
    assert PromptBuilder(tok).split_generation(t.final.response_ids)[1] is False
