"""The reading vocabulary, the curriculum, tied name rows, and a short resumable pretraining run."""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.config_utils import load_config
from memsearcher_jax.data.curriculum import Curriculum, CurriculumConfig, probe_items
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.vocab import ReadingVocab, build_vocab
from memsearcher_jax.models import ModelConfig, Qwen2
from memsearcher_jax.rl.learner import tie_row_updates
from memsearcher_jax.rl.sft import SFTConfig, SFTTrainer, build_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("vocab"))
    build_vocab(d, seed=0)
    return d


@pytest.fixture(scope="module")
def parts(vocab_dir):
    vocab = ReadingVocab.load(vocab_dir)
    tok = load_tokenizer(vocab_dir)
    return vocab, tok, PromptBuilder(tok, default_top_n=2, style="compact")


def test_vocab_is_deterministic_and_pools_are_disjoint(vocab_dir, tmp_path):
    again = str(tmp_path / "again")
    build_vocab(again, seed=0)
    for name in ("tokenizer.json", "reading_vocab.json"):
        assert open(os.path.join(vocab_dir, name), "rb").read() == open(os.path.join(again, name), "rb").read()
    v = ReadingVocab.load(vocab_dir)
    for kind, pools in v.names.items():
        assert not set(pools["pretrain"]) & set(pools["reserved"]), kind
    words = [n for p in v.names.values() for k in p.values() for n in k]
    assert len(set(w.lower() for w in words)) == len(words)
    assert not any(a != b and b.lower().startswith(a.lower()) for a in words[:300] for b in words)


def test_names_and_values_are_one_token_wherever_they_stand(parts):
    vocab, tok, _ = parts
    name, value = vocab.names["person"]["reserved"][3], "1968"
    for text in (name, f" {name}", f'"{name}', f"{{{name}}}", f"(Title: {name})", f"<memory>{name} was"):
        ids = tok.encode(text, add_special_tokens=False)
        assert vocab.ids[name] in ids and tok.decode(ids) == text, text
    for text in (f"the year {value}.", f"\\boxed{{{value}}}"):
        ids = tok.encode(text, add_special_tokens=False)
        assert vocab.ids[value] in ids and tok.decode(ids) == text


def test_curriculum_is_seeded_by_step_and_never_shows_reserved_names(parts):
    vocab, _, builder = parts
    cur = Curriculum(vocab, builder, CurriculumConfig(seed=3, rows_per_world=16))
    a, b = cur.rows_for_step(7, 24), cur.rows_for_step(7, 24)
    assert [(r.prompt_ids, r.response_ids, r.loss_mask) for r in a] == [(r.prompt_ids, r.response_ids, r.loss_mask)
                                                                         for r in b]
    assert [r.prompt_ids for r in cur.rows_for_step(8, 24)] != [r.prompt_ids for r in a]
    reserved = set(vocab.name_ids("reserved"))
    rows = cur.rows_for_step(0, 96)
    assert {r.kind for r in rows} == {"repeat", "recall", "cloze", "demo"}
    for r in rows:
        assert not reserved & set(r.prompt_ids + r.response_ids)
        assert len(r.response_ids) == len(r.loss_mask) and sum(r.loss_mask) > 0


def test_repeat_targets_are_the_second_copy_without_separators(parts):
    vocab, tok, builder = parts
    (r,) = Curriculum(vocab, builder, CurriculumConfig(seed=4, mix=(("repeat", 1.0),))).rows_for_step(0, 1)
    first, _, second = builder.decode(r.prompt_ids + r.response_ids).partition("\n")
    assert first == second and len(first.split()) >= 16
    targets = [t for t, m in zip(r.response_ids, r.loss_mask) if m]
    assert [builder.decode([t]) for t in targets] == first.split()[1:]  # every word after the first, no spaces


def test_cloze_targets_are_the_answers(parts):
    vocab, _, builder = parts
    for r in Curriculum(vocab, builder, CurriculumConfig(seed=1, mix=(("cloze", 1.0),))).rows_for_step(0, 8):
        targets = builder.decode([t for t, m in zip(r.response_ids, r.loss_mask) if m])
        assert targets == "".join(q["golden_answers"][0] + "}\n" for q in r.questions)


def test_probe_items_read_reserved_names_from_context(parts):
    vocab, tok, builder = parts
    reserved = set(vocab.name_ids("reserved"))
    items = probe_items(vocab, builder, 40, seed=2)
    for ids, target, _relation in items:
        text = builder.decode(ids)
        assert text.endswith("\\boxed{") and builder.decode([target]) in text  # the answer is in the context
        assert reserved & set(ids)
    assert len({r for _, _, r in items}) > 3


def test_tied_rows_keep_their_differences():
    u = jnp.arange(12.0).reshape(6, 2)
    groups = jnp.asarray([0, 0, -1, 1, 1, 1])
    got = tie_row_updates({"embed": u, "other": u}, groups, 2)
    np.testing.assert_allclose(got["embed"][:2], [[1.0, 2.0]] * 2)
    np.testing.assert_allclose(got["embed"][2], [4.0, 5.0])
    np.testing.assert_allclose(got["embed"][3:], [[8.0, 9.0]] * 3)
    np.testing.assert_allclose(got["other"], u)  # only the embedding is tied
    # Through a real SFT step: rows of a group move by the same vector.
    model = Qwen2(ModelConfig.tiny(vocab_size=64), rngs=nnx.Rngs(0))
    before = np.asarray(model.embed[...])
    trainer = SFTTrainer(model, SFTConfig(steps=2, batch_size=2, warmup=0, min_len=16, progress=False),
                         tied_rows=[[10, 11, 12], [20, 21]])

    class Row:
        def __init__(self, ids):
            self.prompt_ids, self.response_ids, self.loss_mask = ids[:2], ids[2:], [1] * (len(ids) - 2)

    rows = build_rows([Row([1, 10, 11, 12, 5]), Row([2, 20, 21, 3, 12])], 0, 16)
    trainer.train_step(rows, np.arange(2))
    after = np.asarray(trainer.params["embed"][...])
    moved = after - before
    np.testing.assert_allclose(moved[10], moved[11], atol=1e-7)
    np.testing.assert_allclose(moved[10], moved[12], atol=1e-7)
    np.testing.assert_allclose(moved[20], moved[21], atol=1e-7)
    assert np.abs(moved[10]).max() > 0 and np.abs(moved[10] - moved[20]).max() > 0
    assert np.abs(moved[1] - moved[2]).max() > 0  # untied rows move on their own


@pytest.mark.slow
def test_pretrain_runs_resumes_and_exports(tmp_path):
    from memsearcher_jax.pretrain import BASE_MANIFEST, run_pretrain

    cfg = load_config(os.path.join(ROOT, "configs", "base_tiny.py"), [
        ("model.hidden_size", "32"), ("model.intermediate_size", "64"), ("model.num_layers", "1"),
        ("model.num_heads", "2"), ("model.num_kv_heads", "1"), ("model.head_dim", "16"),
        ("train.batch_size", "4"), ("train.steps", "4"), ("train.save_every", "2"), ("train.probe_every", "2"),
        ("train.probe_items", "16"), ("train.warmup", "1"), ("train.min_len", "512"),
        ("train.output_dir", str(tmp_path / "run"))])
    first = run_pretrain(cfg)
    assert 0.0 <= first["probe"]["accuracy"] <= 1.0 and first["probe"]["n"] == 16
    logged = [json.loads(x)["step"] for x in open(tmp_path / "run" / "logs" / "metrics.jsonl")]
    assert logged == [2, 4]
    cfg.train.steps = 6
    run_pretrain(cfg)  # resumes at step 4
    logged = [json.loads(x)["step"] for x in open(tmp_path / "run" / "logs" / "metrics.jsonl")]
    assert logged == [2, 4, 6]
    base = tmp_path / "run" / "base"
    manifest = json.loads((base / BASE_MANIFEST).read_text())
    assert manifest["tensors"]["model.embed_tokens.weight"][1] == 32
    assert set(manifest["files"]) >= {"model.safetensors", "config.json", "tokenizer.json", "reading_vocab.json"}
    assert ReadingVocab.exists(str(base))
