"""The world's Qwen-style tokenizer: exact round trips, single-id tags, loads with AutoTokenizer."""
import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from memsearcher_jax.data.synthetic import generate_world
from memsearcher_jax.data.tokenizer import AGENT_TAGS, SPECIAL_TOKENS, load_tokenizer, train_tokenizer

PROMPT = ('You are a search agent. Call <tool_call>{"name": "wikipedia_search", "arguments": '
          '{"query": "...", "top_n": 5}}</tool_call> and answer as \\boxed{answer}.')


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=0)


@pytest.fixture(scope="module")
def tok_dir(world, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tok"))
    train_tokenizer(world.texts(), out, vocab_size=1024, extra_texts=[PROMPT], word_pieces=world.name_pieces())
    return out


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


def test_files_and_config(tok_dir):
    assert os.path.isfile(os.path.join(tok_dir, "tokenizer.json"))
    with open(os.path.join(tok_dir, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    assert cfg["eos_token"] == "<|im_end|>" and cfg["pad_token"] == "<|endoftext|>"
    assert "<|im_start|>" in cfg["chat_template"]


def test_autotokenizer_special_ids(tok):
    assert len(tok) <= 1024
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.pad_token_id != tok.eos_token_id
    # Like Qwen: no BOS or other tokens are added around encoded text.
    assert tok("What year?")["input_ids"] == tok.encode("What year?", add_special_tokens=False)
    ids = set()
    for t in SPECIAL_TOKENS + AGENT_TAGS:
        enc = tok.encode(t, add_special_tokens=False)
        assert len(enc) == 1, (t, enc)
        ids.add(enc[0])
    assert len(ids) == len(SPECIAL_TOKENS) + len(AGENT_TAGS)
    # Tags stay single ids inside running text, not only alone.
    enc = tok.encode("x<memory>Gebin</memory>y", add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<memory>") in enc and tok.convert_tokens_to_ids("</memory>") in enc


def test_tags_are_not_special_and_survive_skip_special(tok):
    text = "<|im_start|>assistant\n<think>look</think><tool_call>{}</tool_call><|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>look</think><tool_call>{}</tool_call>"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=200))
def test_ascii_round_trip(tok, text):
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_unicode_round_trip(tok):
    # NFC-normalised text round-trips too (byte-level BPE covers every byte).
    text = "Zürich — café ≠ 東京 🙂 \t\n  end "
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_world_text_round_trip_and_compresses(tok, world):
    for p in world.corpus[:50]:
        ids = tok.encode(p["contents"], add_special_tokens=False)
        assert tok.decode(ids) == p["contents"]
        assert len(ids) < len(p["contents"]) / 2  # BPE learned the templates (bytes would be 1:1)


def test_names_are_never_single_tokens(tok, world):
    # Names must be built from shared pieces so held-out names use tokens trained elsewhere.
    vocab = {t.replace("\u0120", "") for t in tok.get_vocab()}
    assert not vocab & set(world.entities)
    for name in list(world.entities)[:40]:
        assert len(tok.encode(" " + name, add_special_tokens=False)) >= 2


def test_chat_template(tok):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "<question>Q?</question>"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n<question>Q?</question><|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_bad_inputs_named(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["a b"], str(tmp_path / "t"), vocab_size=100)
    with pytest.raises(ValueError, match="concatenate"):
        train_tokenizer(["Gebin"], str(tmp_path / "t"), word_pieces={"Gebin": ["Ge", "bon"]})
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(str(tmp_path))
