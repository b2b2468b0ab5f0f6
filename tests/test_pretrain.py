"""The reading vocabulary, the curriculum, tied name rows, and a short resumable pretraining run."""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.vocab import ReadingVocab, build_vocab
from memsearcher_jax.models import ModelConfig, Qwen2
from memsearcher_jax.pretrain.curriculum import Curriculum, CurriculumConfig, PhasedCurriculum
from memsearcher_jax.pretrain.probes import probe_items
from memsearcher_jax.rl.learner import tie_row_updates
from memsearcher_jax.rl.sft import SFTConfig, SFTTrainer, build_rows
from memsearcher_jax.settings.config_utils import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_V8 = os.path.join(ROOT, "configs", "base_v8.py")


def pool_ids(vocab, kind: str) -> set[int]:
    """Token ids of the names in one pool ("pretrain" or "reserved") of a ReadingVocab."""
    return {vocab.ids[n] for names in vocab.pool(kind).values() for n in names}



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


def test_a_vocab_records_its_wording_and_every_world_built_for_it_follows(vocab_dir, tmp_path):
    """A base reads one wording of the world (synthetic.WORDINGS); its vocabulary records it, and the
    curriculum, the probes and the world cache (the main job's world) write their sentences in it."""
    from memsearcher_jax.data import world_cache
    from memsearcher_jax.data.synthetic import load_world
    from memsearcher_jax.pretrain.probes import pair_probe_items

    v2_dir = str(tmp_path / "v2")
    v2 = build_vocab(v2_dir, seed=0, wording="v2")
    v1 = ReadingVocab.load(vocab_dir)
    assert (v1.wording, v2.wording) == ("v1", "v2")
    assert "wording" not in json.load(open(os.path.join(vocab_dir, "reading_vocab.json")))  # v1 bytes unchanged
    assert v2.names == v1.names and v2.ids == v1.ids  # the same names and values; merges over other templates
    called = "works for the company called"
    for d, vocab in ((vocab_dir, v1), (v2_dir, v2)):
        tok = load_tokenizer(d)
        builder = PromptBuilder(tok, default_top_n=2, style="compact")
        curriculum = Curriculum(vocab, builder, CurriculumConfig(seed=0, mix=(("long", 1.0),), long_passages=(8, 8)))
        text = [tok.decode(r.prompt_ids + r.response_ids) for r in curriculum.rows_for_step(0, 4)]
        text += [tok.decode(ids) for ids, _, _ in pair_probe_items(vocab, builder, 8)]
        text += [tok.decode(ids) for ids, _, _ in probe_items(vocab, builder, 8, n_passages=8)]
        assert all("works for" not in t or (called in t) == (vocab.wording == "v2") for t in text)
        assert any(called in t for t in text) == (vocab.wording == "v2")
        paths = world_cache.prepare_world(str(tmp_path / "cache"), seed=1, num_entities=30, vocab_dir=d)
        corpus = " ".join(p["contents"] for p in load_world(paths.world_dir).corpus)
        assert "works for" in corpus and (called in corpus) == (vocab.wording == "v2")


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
    reserved = pool_ids(vocab, "reserved")
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
    reserved = pool_ids(vocab, "reserved")
    items = probe_items(vocab, builder, 40, seed=2)
    for ids, target, _relation in items:
        text = builder.decode(ids)
        assert text.endswith("\\boxed{") and builder.decode([target]) in text  # the answer is in the context
        assert reserved & set(ids)
    assert len({r for _, _, r in items}) > 3


def test_pair_probe_items_ask_one_context_about_each_of_its_two_entities(parts):
    from memsearcher_jax.pretrain.probes import pair_probe_items

    vocab, _, builder = parts
    reserved = pool_ids(vocab, "reserved")
    q_open = builder.encode("<question>")[0]  # the tag is one token
    items = pair_probe_items(vocab, builder, 40, seed=3)
    assert len(items) == 80
    for (ids_a, target_a, rel_a), (ids_b, target_b, rel_b) in zip(items[0::2], items[1::2]):
        cut_a, cut_b = ids_a.index(q_open), ids_b.index(q_open)
        assert ids_a[:cut_a] == ids_b[:cut_b]  # one context
        context = builder.decode(ids_a[:cut_a])
        assert rel_a == rel_b and target_a != target_b  # one relation, two values
        assert builder.decode([target_a]) in context and builder.decode([target_b]) in context
        named_a = [t for t in ids_a[cut_a:] if t in reserved]
        named_b = [t for t in ids_b[cut_b:] if t in reserved]
        assert named_a and named_b and named_a != named_b  # each question names its own entity
        assert context.count("<tool_response>") == 1 and reserved & set(ids_a[:cut_a])
    assert len({r for _, _, r in items}) > 3


def test_pair_hits_count_a_pair_only_when_both_answers_are_right():
    from memsearcher_jax.pretrain import pair_hits

    hits = [True, True, True, False, False, False, False, True, True, True]
    rels = ["a", "a", "b", "b", "a", "a", "b", "b", "b", "b"]
    assert pair_hits(hits, rels) == {"both": 0.4, "n": 5, "by_relation": {"a": 0.5, "b": 1 / 3}}
    # A reader that gives each context one answer, whoever is named, is right on one of each pair.
    assert pair_hits([True, False] * 4, ["a"] * 8)["both"] == 0.0
    with pytest.raises(ValueError, match="in pairs"):
        pair_hits([True, True, False], ["a", "a", "a"])


def _context_rows(parts, kind, n=48, seed=5):
    vocab, _, builder = parts
    cfg = CurriculumConfig(seed=seed, mix=((kind, 1.0),), max_len=1024)
    return builder, Curriculum(vocab, builder, cfg).rows_for_step(0, n)


@pytest.mark.parametrize("kind", ["long", "bind", "multi"])
def test_context_rows_ask_what_their_context_states(parts, kind):
    builder, rows = _context_rows(parts, kind)
    for r in rows:
        context = builder.decode(r.prompt_ids)
        targets = builder.decode([t for t, m in zip(r.response_ids, r.loss_mask) if m])
        asks = [r.questions[i:i + r.per_ask] for i in range(0, len(r.questions), r.per_ask)]
        assert targets == "".join("; ".join(q["golden_answers"][0] for q in ask) + "}\n" for ask in asks)
        asked = builder.decode(r.response_ids)
        for q in r.questions:
            # The answer's sentence, naming the asked entity, is in the context (both hops' for 2-hop).
            assert q["subject"] in r.passages and all(fact in context for fact in q["facts"]), q
            assert q["question"] in asked
        assert len(r) <= 1024


def test_multi_rows_join_two_questions_about_different_entities(parts):
    builder, rows = _context_rows(parts, "multi")
    for r in rows:
        assert r.per_ask == 2 and len(r.questions) % 2 == 0
        pairs = [r.questions[i:i + 2] for i in range(0, len(r.questions), 2)]
        assert sum(a["subject"] != b["subject"] for a, b in pairs) >= len(pairs) - 1
        text = builder.decode(r.response_ids)
        a, b = pairs[0]
        assert f"<question> {a['question']}; {b['question']} </question>" in text
        assert f"\\boxed{{{a['golden_answers'][0]}; {b['golden_answers'][0]}}}" in text


def test_bind_rows_show_right_kind_values_of_other_entities(parts):
    builder, rows = _context_rows(parts, "bind", n=64)
    from memsearcher_jax.data.synthetic import ONE_HOP
    relations, several = set(), 0
    for r in rows:
        context = builder.decode(r.prompt_ids)
        relation = r.questions[0]["relation"]
        assert {q["relation"] for q in r.questions} == {relation}  # one relation asked throughout
        relations.add(relation)
        # Another shown entity states the same relation, with a value of the same kind, and the
        # questions ask about more than one entity when the row shows several.
        template = next(t for rels in ONE_HOP.values() for rel, (_, _, t) in rels.items() if rel == relation)
        lead = template.split("{a}")[0]
        stated = [name for name in r.passages if lead.format(s=name) in context]
        assert len(stated) >= 2, (relation, r.passages)
        assert {q["subject"] for q in r.questions} <= set(stated)
        several += len({q["subject"] for q in r.questions}) >= 2
    assert len(relations) >= 6  # the asked relation varies over types and relations
    assert several == len(rows)  # each row asks the relation of at least two entities


def test_long_rows_spread_length_and_the_asked_position(parts):
    _, rows = _context_rows(parts, "long", n=96, seed=6)
    counts = [len(r.passages) for r in rows]
    assert min(counts) == 4 and max(counts) == 16
    assert max(len(r.prompt_ids) for r in rows) > 800
    where = [r.passages.index(q["subject"]) / (len(r.passages) - 1)
             for r in rows for q in r.questions if q["hops"] == 1]
    assert min(where) == 0.0 and max(where) == 1.0
    quarters = np.histogram(where, bins=4, range=(0, 1))[0]
    assert quarters.min() > 0.15 * len(where), quarters  # roughly uniform over the whole length


WORKFLOWS = ("memsearcher", "react", "mem1", "memory_ops")


def test_demo_episodes_come_in_equal_shares_of_every_workflow_and_objective_count(parts, monkeypatch):
    """With several demo formats, every (workflow, objectives) pair is recorded equally often
    (per world, in turn from a random start), multi-objective episodes ask distinct questions
    joined in one `<question>`, and each conversation is tagged with its pair."""
    from memsearcher_jax.pretrain import curriculum as cur_mod
    vocab, _, builder = parts
    episodes, real = [], cur_mod.make_demonstrations

    def counted(questions, *args, config, **kwargs):
        (q,) = questions
        subs = q.get("objectives", [q])
        assert len({s["id"] for s in subs}) == len(subs)  # distinct questions
        episodes.append((config.workflow, len(subs)))
        assert config.max_turns == 4 * len(subs)
        return real(questions, *args, config=config, **kwargs)

    monkeypatch.setattr(cur_mod, "make_demonstrations", counted)
    cfg = CurriculumConfig(seed=3, mix=(("demo", 1.0),), max_len=1024, demo_workflows=WORKFLOWS,
                           demo_objectives=(1, 2), rows_per_world=16)
    rows = Curriculum(vocab, builder, cfg).rows_for_step(0, 400)
    pairs = {(w, k) for w in WORKFLOWS for k in (1, 2)}
    counts = {p: episodes.count(p) for p in pairs}
    assert set(episodes) == pairs and max(counts.values()) - min(counts.values()) <= 2 + len(episodes) // 20, counts
    assert {r.kind for r in rows} == {f"demo:{w}:{k}" for w, k in pairs}
    two = next(r for r in rows if r.kind == "demo:react:2")
    text = builder.decode(two.prompt_ids + two.response_ids)
    assert text.count("<question>") >= 1 and "; " in text.split("<question>")[1].split("</question>")[0]


def test_demo_formats_change_nothing_without_demo_rows(parts):
    """The phase-1 rows of a run are the same whatever its later phase's demo formats are."""
    vocab, _, builder = parts
    mix = (("repeat", 0.3), ("recall", 0.2), ("cloze", 0.5))
    plain = Curriculum(vocab, builder, CurriculumConfig(seed=0, mix=mix))
    formats = Curriculum(vocab, builder, CurriculumConfig(seed=0, mix=mix, demo_workflows=WORKFLOWS,
                                                           demo_objectives=(1, 2)))
    for step in (0, 9):
        a, b = plain.rows_for_step(step, 32), formats.rows_for_step(step, 32)
        assert [(r.prompt_ids, r.response_ids, r.loss_mask) for r in a] == \
               [(r.prompt_ids, r.response_ids, r.loss_mask) for r in b]
    with pytest.raises(ValueError, match="demo_workflows"):
        CurriculumConfig(demo_workflows=("memsearcher", "nope"))
    with pytest.raises(ValueError, match="demo_objectives"):
        CurriculumConfig(demo_objectives=(0,))


def test_name_copy_weighs_repeated_names_beside_the_answers(parts):
    """name_copy: a context row's names seen earlier in the row become targets at that weight;
    answers keep 1; first mentions, non-names and rows of other kinds are untouched; the same
    rows (tokens) are drawn, and 0 leaves every row as it was."""
    from memsearcher_jax.pretrain.curriculum import with_name_copy
    vocab, _, builder = parts
    mix = (("recall", 0.2), ("cloze", 0.4), ("long", 0.2), ("bind", 0.2))
    plain = Curriculum(vocab, builder, CurriculumConfig(seed=0, mix=mix, max_len=1024))
    copy = Curriculum(vocab, builder, CurriculumConfig(seed=0, mix=mix, max_len=1024, name_copy=0.25))
    names = pool_ids(vocab, "pretrain") | pool_ids(vocab, "reserved")
    a, b = plain.rows_for_step(3, 24), copy.rows_for_step(3, 24)
    assert [r.prompt_ids + r.response_ids for r in a] == [r.prompt_ids + r.response_ids for r in b]
    n_copy = 0
    for ra, rb in zip(a, b):
        if ra.kind == "recall":
            assert rb.loss_mask == ra.loss_mask
            continue
        ids = ra.prompt_ids + ra.response_ids
        before = [0] * len(ra.prompt_ids) + list(ra.loss_mask)
        after = [0] + list(rb.loss_mask)
        assert len(rb.prompt_ids) == 1 and len(after) == len(ids)
        for i, (t, m0, m1) in enumerate(zip(ids, before, after)):
            if m0:
                assert m1 == m0                       # answers keep their weight
            elif t in names and t in ids[:i]:
                assert m1 == 0.25
                n_copy += 1
            else:
                assert m1 == 0                        # first mentions and other tokens
    assert n_copy > 10 * len(b)
    from memsearcher_jax.rl.sft import pack_rows
    packed = pack_rows(b, builder.pad_id, 1024)              # the weights reach the loss as they are
    assert np.isclose(packed.weights.sum(), sum(sum(r.loss_mask) for r in b))
    assert np.isclose((packed.weights == 0.25).sum(), n_copy)
    # Built by hand: prompt "X a X", response "X" (answer) then "b"; X a name, a/b not.
    x = sorted(names)[0]
    row = with_name_copy(type(a[0])(prompt_ids=[x, 7, x], response_ids=[x, 8], loss_mask=[1, 0]), frozenset(names), 0.5)
    assert row.prompt_ids == [x] and row.response_ids == [7, x, x, 8] and row.loss_mask == [0.0, 0.5, 1.0, 0.0]
    with pytest.raises(ValueError, match="name_copy"):
        CurriculumConfig(name_copy=2.0)
    from memsearcher_jax.pretrain import phase_records
    cfg = load_config(BASE_V8)
    for phase in cfg.phases:
        phase["name_copy"] = 0.0
    assert all("name_copy" not in p for p in phase_records(cfg))   # off: the manifest as before
    for phase in cfg.phases:
        phase["name_copy"] = 0.25
    cfg.phases[0]["name_copy"] = 0.0
    first, *_, last = phase_records(cfg)
    assert "name_copy" not in first and last["name_copy"] == 0.25  # a phase's own setting, recorded


def test_copy_probe_items_ask_for_the_word_the_first_copy_has_there(parts):
    """A copy item's answer is the word at the same place in the run's first copy, a reserved
    name or a value, and it is in the context; no pretrain name appears."""
    from memsearcher_jax.pretrain.probes import copy_probe_items
    vocab, _, builder = parts
    items = copy_probe_items(vocab, builder, 40, seed=5)
    assert items == copy_probe_items(vocab, builder, 40, seed=5)
    assert items != copy_probe_items(vocab, builder, 40, seed=6)
    newline = builder.encode("\n")
    words = pool_ids(vocab, "reserved") | {vocab.ids[v] for vs in vocab.values.values() for v in vs}
    for ctx, target, kind in items:
        assert kind == "copy" and target in words and not set(ctx) & pool_ids(vocab, "pretrain")
        cut = next(i for i in range(len(ctx)) if ctx[i:i + len(newline)] == newline)
        first, second = ctx[:cut], ctx[cut + len(newline):]
        assert first[len(second)] == target       # the next word of the first copy


def test_positional_biases_make_heads_attend_their_offsets():
    """The biases alone (content terms 0) give each head of a named layer its largest rope score
    at its offset, sharply enough to be near one-hot at the strength base_v8 uses; the layers
    not named keep their biases."""
    from memsearcher_jax.models.qwen2 import apply_rope, rope_cos_sin
    from memsearcher_jax.pretrain.model_init import positional_biases
    L, H, K, Dh, T = 3, 4, 2, 32, 24
    rng = np.random.default_rng(0)
    q0, k0 = rng.normal(size=(L, H, Dh)), rng.normal(size=(L, K, Dh))
    offsets = {0: (1, 2, 3, 4), 2: (5, 7)}
    qb, kb = positional_biases(q0, k0, offsets, 8.0, 10000.0)
    np.testing.assert_array_equal(qb[1], q0[1].astype(np.float32))
    np.testing.assert_array_equal(kb[1], k0[1].astype(np.float32))
    cos, sin = rope_cos_sin(jnp.arange(T)[None], Dh, 10000.0)
    for layer, deltas in offsets.items():
        for h in range(H):
            q = apply_rope(jnp.broadcast_to(jnp.asarray(qb[layer, h]), (1, T, 1, Dh)), cos, sin)[0, :, 0]
            k = apply_rope(jnp.broadcast_to(jnp.asarray(kb[layer, h // (H // K)]), (1, T, 1, Dh)), cos, sin)[0, :, 0]
            scores = np.asarray(q[T - 1] @ k.T) / np.sqrt(Dh)      # the last query against every key
            d = deltas[h % len(deltas)]
            assert int(np.argmax(scores)) == T - 1 - d, (layer, h)
            probs = np.exp(scores - scores.max())
            assert probs[T - 1 - d] / probs.sum() > 0.5, (layer, h)


def _cut(cfg, n: int, steps: int):
    """cfg with its first n phases only, train.steps steps (a run that ended earlier, or a shorter one)."""
    cfg.phases, cfg.train.steps = cfg.phases[:n], steps
    return cfg


def _same_steps(phase):
    """What a phase does to its steps (start, rows, batch, rate): its end moves with the phase after it."""
    return phase.start, phase.curriculum, phase.batch_size, phase.learning_rate


def test_each_phase_is_what_its_entry_sets():
    """A phase's curriculum is its entry's mix and settings, CurriculumConfig's defaults for what it
    leaves out (nothing comes from another phase); a phase added leaves the ones before it as they
    were; the list is validated before any work."""
    from memsearcher_jax.pretrain import phase_list, phase_records, validate_pretrain
    cfg = load_config(BASE_V8)
    before = phase_list(cfg)
    first, second = before[0].curriculum, before[1].curriculum
    assert first.long_passages == tuple(cfg.phases[0]["long_passages"]) != second.long_passages
    assert first.bind_entities == tuple(cfg.phases[0]["bind_entities"]) != second.bind_entities
    assert first.name_copy == second.name_copy == cfg.phases[1]["name_copy"] > 0
    assert first.demo_workflows == second.demo_workflows and "demo" not in dict(first.mix)
    _cut(cfg, 2, 4000)
    cfg.phases = (*cfg.phases, {"start": 2500, "max_len": 1024, "batch_size": 32, "mix": {"repeat": 0.5, "bind": 0.5},
                                "name_copy": 0.5, "bind_entities": (4, 8)})
    phases = phase_list(cfg)
    assert [_same_steps(p) for p in phases[:2]] == [_same_steps(p) for p in before[:2]]
    assert phases[2].start == 2500 and phases[2].batch_size == before[1].batch_size
    third = phases[2].curriculum
    assert third.mix == (("repeat", 0.5), ("bind", 0.5)) and third.name_copy == 0.5 and third.bind_entities == (4, 8)
    assert third.long_passages == CurriculumConfig.long_passages   # left out: the default, not the phase before's
    assert third.demo_workflows == CurriculumConfig.demo_workflows != second.demo_workflows
    assert [p["steps"] for p in phase_records(cfg)] == ["0-1200", "1200-2500", "2500-4000"]
    validate_pretrain(cfg)
    cfg.phases[2]["start"] = 1000                     # inside the phase before
    with pytest.raises(ValueError, match=r"phases\[2\]: start must be in \(1200, train.steps=4000\)"):
        validate_pretrain(cfg)
    cfg.phases[2]["start"] = 2500
    cfg.phases[2]["lr"] = 1.0                         # not a phase setting
    with pytest.raises(ValueError, match=r"phases\[2\] sets \['lr'\]"):
        validate_pretrain(cfg)
    del cfg.phases[2]["lr"]
    cfg.phases[2]["learning_rate"] = -1.0
    with pytest.raises(ValueError, match=r"phases\[2\]: learning_rate must be > 0"):
        validate_pretrain(cfg)
    cfg.phases[2]["learning_rate"] = 0.0
    cfg.phases[2]["mix"] = {"reading": 1.0}          # not a row kind
    with pytest.raises(ValueError, match=r"phases\[2\]: mix must be \{kind: weight\} over"):
        validate_pretrain(cfg)
    cfg.phases[2]["mix"] = {"repeat": 1.0}
    cfg.phases[2]["long_passages"] = (9, 4)          # CurriculumConfig's own check, named
    with pytest.raises(ValueError, match=r"long_passages must be an increasing range"):
        validate_pretrain(cfg)


def test_a_phase_setting_is_overridden_on_the_command_line_and_only_there():
    """--config.phases.N.KEY=VALUE sets one phase's value (typed as the value it replaces); the other
    phases, built from the same settings in the config file, keep theirs; a wrong index or key is
    refused, naming what exists."""
    from memsearcher_jax.settings.config_utils import ConfigError
    cfg = load_config(BASE_V8, [("phases.3.learning_rate", "2e-4"), ("phases.0.mix.bind", "0.5"),
                                ("phases.1.long_passages", "(3, 9)")])
    assert cfg.phases[3]["learning_rate"] == 2e-4 and cfg.phases[0]["mix"]["bind"] == 0.5
    assert cfg.phases[1]["long_passages"] == (3, 9) and cfg.phases[3]["long_passages"] == (4, 16)
    plain = load_config(BASE_V8)
    untouched = lambda c: [p for i, p in enumerate(c.phases) if i not in (0, 1, 3)]
    assert untouched(cfg) == untouched(plain) and plain.phases[0]["mix"]["bind"] == 0.4
    with pytest.raises(ConfigError, match="'6' is not an index of a list of 6"):
        load_config(BASE_V8, [("phases.6.start", "1")])
    with pytest.raises(ConfigError, match=r"--config.phases.0.lr; valid keys here: \[.*'learning_rate'"):
        load_config(BASE_V8, [("phases.0.lr", "1")])
    with pytest.raises(ConfigError, match="expected an integer"):
        load_config(BASE_V8, [("phases.1.start", "soon")])


def test_a_phase_learning_rate_holds_from_its_start_only():
    """A phase's learning_rate: a constant rate from its start; every step before it keeps the
    schedule it had without the phase, so the config still reproduces a run extended that way.
    The first phase runs on the warm-up + cosine (a rate there is refused)."""
    from memsearcher_jax.pretrain import optim_config, phase_list, phase_records, validate_pretrain
    cfg = _cut(load_config(BASE_V8), 2, 4300)
    cfg.train.decay_steps = 4000
    plain = optim_config(cfg).schedule_fn()
    cfg.phases = (*cfg.phases, dict(cfg.phases[1], name="later", start=3000, learning_rate=7e-4))
    validate_pretrain(cfg)
    lr = optim_config(cfg).schedule_fn()
    for step in (0, 200, 1500, 2999):
        assert float(lr(step)) == float(plain(step))
    assert float(lr(3000)) == float(lr(cfg.train.steps)) == pytest.approx(7e-4)
    records = phase_records(cfg)
    assert records[-1]["steps"] == f"3000-{cfg.train.steps}"
    assert records[-1]["learning_rate"]["start"] == pytest.approx(7e-4)
    assert records[-1]["learning_rate"]["schedule"].endswith("0.0007 constant from step 3000")
    assert "learning_rate" not in dict(phase_list(cfg)[-1].curriculum.mix)
    cfg.phases[0]["learning_rate"] = 1e-3
    with pytest.raises(ValueError, match=r"phases\[0\] \(binding\): learning_rate must be 0"):
        validate_pretrain(cfg)


def test_phases_added_after_a_run_ended_leave_every_earlier_step_as_it_ran():
    """Phases added after a run ended (reading_v7's fourth and fifth, at step 9600): each is what its
    entry sets (phase 2's rows again, then phase 3's), at its own rate from its start; every step before
    step 9600 keeps the rows and rate it had, so the config reproduces the run; a list out of order, or
    one that does not start at step 0, is refused."""
    from memsearcher_jax.pretrain import optim_config, phase_list, phase_records, validate_pretrain
    cfg = _cut(load_config(BASE_V8), 5, 10400)                # reading_v7's run
    validate_pretrain(cfg)
    ran = _cut(load_config(BASE_V8), 3, 9600)                 # the run as it first ended
    phases, before = phase_list(cfg), phase_list(ran)
    assert [_same_steps(p) for p in phases[:3]] == [_same_steps(p) for p in before]
    assert [p.start for p in phases] == [0, 1200, 9000, 9600, 10000]
    assert phases[3].curriculum == phases[1].curriculum and phases[4].curriculum == phases[2].curriculum
    lr, lr_ran = optim_config(cfg).schedule_fn(), optim_config(ran).schedule_fn()
    for step in (0, 199, 1200, 5000, 8999, 9000, 9599):
        assert float(lr(step)) == float(lr_ran(step))
    assert float(lr(9599)) == pytest.approx(3e-4)
    assert float(lr(9600)) == float(lr(10000)) == float(lr(cfg.train.steps)) == pytest.approx(1e-4)
    assert [r["steps"] for r in phase_records(cfg)][-2:] == ["9600-10000", "10000-10400"]
    cfg.phases[4]["start"] = 9500                             # before the one above it in the list
    with pytest.raises(ValueError, match=r"phases\[4\] \(episodes again\): start must be in \(9600"):
        validate_pretrain(cfg)
    cfg.phases[4]["start"] = 10000
    cfg.phases[0]["start"] = 5                                # the run's first steps in no phase
    with pytest.raises(ValueError, match=r"phases\[0\] \(binding\): start must be 0"):
        validate_pretrain(cfg)
    cfg.phases[0]["start"] = 0
    cfg.reading_phase = ml_collections.ConfigDict({"start": 1200})  # a phase as a section: the layout before lists
    with pytest.raises(ValueError, match=r"sets \['reading_phase'\]: phases are now one list"):
        validate_pretrain(cfg)


def test_base_v8_is_reading_v7_and_then_a_reading_phase():
    """configs/base_v8.py's run was started from reading_v7's checkpoint 10400: every step before 10400
    has the rows and rate of its first five phases (reading_v7's run), so the copied checkpoint is the
    step its config reaches; then phase 2's rows at 5e-5, with the phase's first checkpoint kept
    (keep_period)."""
    from memsearcher_jax.pretrain import optim_config, phase_list, validate_pretrain
    v8 = load_config(BASE_V8)
    v7 = _cut(load_config(BASE_V8), 5, 10400)
    validate_pretrain(v8)
    p7, p8 = phase_list(v7), phase_list(v8)
    assert [_same_steps(p) for p in p8[:5]] == [_same_steps(p) for p in p7]
    assert p8[5].start == 10400 and p8[5].curriculum == p8[1].curriculum   # phase 2's rows
    lr7, lr8 = optim_config(v7).schedule_fn(), optim_config(v8).schedule_fn()
    for step in (0, 1200, 8999, 9000, 9600, 10000, 10399):
        assert float(lr8(step)) == float(lr7(step))
    assert float(lr8(10400)) == float(lr8(v8.train.steps)) == pytest.approx(5e-5)
    assert 10400 % v8.train.keep_period == 0
    v8.train.keep_period = -1
    with pytest.raises(ValueError, match="train.keep_period must be an integer >= 0"):
        validate_pretrain(v8)


def test_base_v8_phases_are_the_shipped_manifests():
    """configs/base_v8.py alone reproduces the shipped reading_v8: its phase list is the one the base's
    manifest records, phase by phase (steps, mix, episode formats, name_copy, context settings,
    max_len, batch size, the learning rate where each phase starts and ends, the schedule), and its
    vocabulary, model and run settings are the ones the manifest's config records. (The manifest does
    not record recall_pairs, repeat_tokens or the episode formats of a phase without episodes: those
    are CurriculumConfig's defaults in the config, as they were in the run.)"""
    from memsearcher_jax.bases import DEFAULT_BASE
    from memsearcher_jax.pretrain import BASE_MANIFEST, optim_config, phase_records, validate_pretrain
    with open(os.path.join(DEFAULT_BASE, BASE_MANIFEST), encoding="utf-8") as f:
        manifest = json.load(f)
    cfg = load_config(BASE_V8)
    validate_pretrain(cfg)
    recorded = manifest["phases"]
    # The config's own entries against the records, field by field (not through phase_records).
    ends = [p["start"] for p in cfg.phases[1:]] + [cfg.train.steps]
    lr = optim_config(cfg).schedule_fn()
    assert len(cfg.phases) == len(recorded) == 6
    for phase, end, record in zip(cfg.phases, ends, recorded):
        assert record["steps"] == f"{phase['start']}-{end}"
        assert record["curriculum"] == phase["mix"]
        assert (record["max_len"], record["batch_size"]) == (phase["max_len"], phase["batch_size"])
        assert record.get("name_copy", 0.0) == phase["name_copy"]
        assert record["contexts"] == {"cloze_passages": list(phase["cloze_passages"]),
                                      "long_passages": list(phase["long_passages"]),
                                      "bind_entities": list(phase["bind_entities"]),
                                      "questions_per_row": phase["cloze_questions"]}
        if phase["mix"].get("demo", 0) > 0:
            assert record["demo_episodes"]["workflows"] == list(phase["demo_workflows"])
            assert record["demo_episodes"]["objectives"] == list(phase["demo_objectives"])
        if phase["learning_rate"]:
            assert record["learning_rate"]["start"] == phase["learning_rate"]
        assert record["learning_rate"]["start"] == round(float(lr(phase["start"])), 8)
        assert record["learning_rate"]["end"] == round(float(lr(end)), 8)
    assert phase_records(cfg) == recorded                      # and every record whole, as an export writes it
    shipped = manifest["config"]
    mine = json.loads(json.dumps(cfg.to_dict(), default=list))
    assert mine["vocab"] == shipped["vocab"] and mine["model"] == shipped["model"]
    # The run's settings; batch_size and max_len are per phase now (checked above).
    assert mine["train"] == {k: v for k, v in shipped["train"].items() if k not in ("batch_size", "max_len")}
    assert mine["curriculum"] == {k: shipped["curriculum"][k] for k in ("world_entities", "rows_per_world", "top_n")}


def test_an_extended_run_keeps_its_schedule_and_phases():
    """train.decay_steps fixes where the cosine ends: raising train.steps past it changes no
    learning rate before it (the floor holds after), so the extended config reproduces the run."""
    from memsearcher_jax.pretrain import optim_config, phase_records, validate_pretrain
    cfg = _cut(load_config(BASE_V8), 2, 4000)        # the schedule alone (a later phase sets its own rate)
    cfg.train.decay_steps = 4000
    cfg.train.steps = cfg.train.decay_steps
    before = optim_config(cfg).schedule_fn()
    first = phase_records(cfg)
    cfg.train.steps = cfg.train.decay_steps + 2000
    after = optim_config(cfg).schedule_fn()
    validate_pretrain(cfg)
    for step in (0, 100, 1500, cfg.train.decay_steps - 1, cfg.train.decay_steps):
        assert float(after(step)) == float(before(step))
    floor = cfg.train.learning_rate * cfg.train.final_lr_fraction
    assert float(after(cfg.train.steps - 1)) == pytest.approx(floor)
    records = phase_records(cfg)
    same = lambda r: {**r, "learning_rate": {k: v for k, v in r["learning_rate"].items() if k != "schedule"}}
    assert same(records[0]) == same(first[0]) and records[-1]["learning_rate"]["schedule"].endswith("constant after")
    assert records[-1]["steps"] == f"{cfg.phases[1]['start']}-{cfg.train.steps}"
    cfg.train.decay_steps = cfg.train.steps + 1
    with pytest.raises(ValueError, match="decay_steps"):
        validate_pretrain(cfg)


@pytest.mark.parametrize("field,value,message", [
    ("mimetic_init", 1.5, "mimetic_init must be in"),
    ("positional_heads", ((1,), (2,), (3,), (4,), (5,)), "at most num_layers=4"),
    ("positional_heads", ((0, 1),), "offsets >= 1"),
    ("positional_heads", ((1,) * 9,), "more offsets in a layer than its num_heads=8"),
    ("positional_strength", 0.0, "positional_strength must be > 0"),
])
def test_the_model_init_settings_are_checked_before_any_work(field, value, message):
    from memsearcher_jax.pretrain import validate_pretrain
    cfg = load_config(BASE_V8)
    validate_pretrain(cfg)
    cfg.model[field] = value
    with pytest.raises(ValueError, match=message):
        validate_pretrain(cfg)


def test_mimetic_attention_starts_heads_near_matching_and_copying():
    """Hand-made kernels: alpha 1 makes each group's W_k its first head's W_q and every head's
    W_o its group's W_v^T (so W_q W_k^T and W_v W_o are positive semi-definite); alpha 0
    changes nothing; q and v are never touched."""
    from memsearcher_jax.pretrain.model_init import mimetic_attention
    rng = np.random.default_rng(0)
    L, D, H, K, Dh = 2, 8, 4, 2, 3
    q, k, v = (rng.normal(size=(L, D, n, Dh)).astype(np.float32) for n in (H, K, K))
    o = rng.normal(size=(L, H, Dh, D)).astype(np.float32)
    q0, v0 = q.copy(), v.copy()
    k1, o1 = mimetic_attention(q, k, v, o, 1.0)
    np.testing.assert_array_equal(k1[:, :, 0], q[:, :, 0])
    np.testing.assert_array_equal(k1[:, :, 1], q[:, :, 2])
    for h in range(H):
        np.testing.assert_array_equal(o1[:, h], np.swapaxes(v[:, :, h // 2], 1, 2))
        qk = q[0, :, h] @ k1[0, :, h // 2].T
        vo = v[0, :, h // 2] @ o1[0, h]
        if h % 2 == 0:
            assert np.linalg.eigvalsh((qk + qk.T) / 2).min() > -1e-5
        assert np.linalg.eigvalsh((vo + vo.T) / 2).min() > -1e-5
    k0, o0 = mimetic_attention(q, k, v, o, 0.0)
    np.testing.assert_array_equal(k0, k)
    np.testing.assert_array_equal(o0, o)
    half, _ = mimetic_attention(q, k, v, o, 0.5)
    np.testing.assert_allclose(half, (k + k1) / 2, rtol=1e-6)
    np.testing.assert_array_equal(q, q0)
    np.testing.assert_array_equal(v, v0)


def test_phased_curriculum_switches_at_its_first_steps(parts):
    vocab, _, builder = parts
    short = Curriculum(vocab, builder, CurriculumConfig(seed=0, mix=(("repeat", 1.0),)))
    long = Curriculum(vocab, builder, CurriculumConfig(seed=0, mix=(("long", 1.0),), max_len=1024))
    cur = PhasedCurriculum([(0, short), (5, long)])
    assert {r.kind for r in cur.rows_for_step(4, 8)} == {"repeat"}
    assert {r.kind for r in cur.rows_for_step(5, 8)} == {"long"}
    assert [r.prompt_ids for r in cur.rows_for_step(7, 4)] == [r.prompt_ids for r in long.rows_for_step(7, 4)]
    with pytest.raises(ValueError, match="start at step 0"):
        PhasedCurriculum([(3, short)])


def test_probe_sets_final_items_are_new_and_lengths_are_long(parts):
    from memsearcher_jax.pretrain import probe_sets

    vocab, _, builder = parts
    progress = probe_sets(vocab, builder, 24, seed=0)
    final = probe_sets(vocab, builder, 24, seed=0, final=True)
    assert set(progress) == set(final) == {"2", "8", "16", "multi", "binding"}
    # The 2-passage progress set is the one every earlier base was probed with.
    assert progress["2"] == probe_items(vocab, builder, 24, seed=1000)
    for key in progress:
        seen = {tuple(ids) for ids, _, _ in progress[key]}
        assert not seen & {tuple(ids) for ids, _, _ in final[key]}, key
    assert min(len(ids) for ids, _, _ in final["16"]) > 750 and np.mean([len(ids) for ids, _, _ in final["16"]]) > 800
    assert min(len(ids) for ids, _, _ in final["8"]) > 2 * max(len(ids) for ids, _, _ in final["2"])
    def name_ids(pool):  # token ids of one pool's names
        return {vocab.ids[n] for kinds in vocab.names.values() for n in kinds[pool]}

    reserved, pretrain = name_ids("reserved"), name_ids("pretrain")
    for ids, target, rel in final["multi"]:
        assert rel == "multi" and not pretrain & set(ids) and reserved & set(ids)
        first, _, second = builder.decode(target).partition("; ")
        question = builder.decode(ids).rsplit("<question>", 1)[1]
        assert first and second and first in builder.decode(ids) and second in builder.decode(ids)
        assert question.count("?; ") == 1 and question.endswith("</question>\n\\boxed{")
    # Binding items: two passages about two entities of one type, both stating the asked relation
    # with a value of its kind; the answer is the asked subject's, the other one is there too.
    type_of = {n: t for t, pools in vocab.names.items() for names in pools.values() for n in names}
    for ids, target, _ in final["binding"]:
        text = builder.decode(ids)
        first, second = (text.split("(Title: ")[k].split(")")[0] for k in (1, 2))
        assert first != second and type_of[first] == type_of[second], text
        question = text.rsplit("<question>", 1)[1]
        assert (first in question) != (second in question) and not pretrain & set(ids)
        assert builder.decode([target]) in text.split("</tool_response>")[0]


def test_reading_probe_scores_a_multi_token_answer_only_when_every_token_is_greedy():
    from memsearcher_jax.pretrain import reading_probe

    model = Qwen2(ModelConfig.tiny(vocab_size=64), rngs=nnx.Rngs(1))
    rng = np.random.default_rng(0)
    contexts = [list(rng.integers(3, 64, size=int(rng.integers(5, 30)))) for _ in range(6)]
    # The model's own greedy continuation, 3 tokens: one jitted forward of the right-padded batch
    # per token (causal attention: padding after a row's end changes nothing before it).
    forward = nnx.jit(lambda m, x: m(x))
    seqs = [list(c) for c in contexts]
    for _ in range(3):
        batch = np.zeros((len(seqs), 40), np.int32)
        for i, seq in enumerate(seqs):
            batch[i, :len(seq)] = seq
        logits = np.asarray(forward(model, jnp.asarray(batch)))
        for i, seq in enumerate(seqs):
            seq.append(int(np.argmax(logits[i, len(seq) - 1])))
    greedy = [seq[len(ctx):] for seq, ctx in zip(seqs, contexts)]
    items = [(c, g, "a") for c, g in zip(contexts, greedy)]
    assert reading_probe(model, items, pad_id=0)["accuracy"] == 1.0
    wrong_last = [(c, g[:2] + [(g[2] + 1) % 64], "a") for c, g in zip(contexts, greedy)]
    assert reading_probe(model, wrong_last, pad_id=0)["accuracy"] == 0.0
    single = reading_probe(model, [(c, g[0], "b") for c, g in zip(contexts, greedy)], pad_id=0)
    assert single["accuracy"] == 1.0 and single["by_relation"] == {"b": 1.0}
    # Each item's result, in item order (the manifest keeps them: a check recomputes any subset).
    from memsearcher_jax.pretrain import unpack_hits
    pattern = [i % 3 != 1 for i in range(len(items))]
    mixed = reading_probe(model, [it if ok else bad for it, bad, ok in zip(items, wrong_last, pattern)], pad_id=0)
    assert unpack_hits(mixed["hits"], len(items)).tolist() == pattern
    assert mixed["accuracy"] == pytest.approx(np.mean(pattern))


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
    trainer = SFTTrainer(model, SFTConfig(max_len=2048, steps=2, batch_size=2, warmup=0, min_len=16, progress=False),
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


def _user_files(root) -> dict:
    return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(root) for f in files}


# base_v8 cut to its first three phases (steps 0-2, 2-3, 3-; batch 4, 2, 2), for a run of a few steps.
SHORT_CONFIG = """from memsearcher_jax.settings.config_utils import load_config


def get_config():
    c = load_config({base!r})
    c.phases = tuple(dict(p, start=s, batch_size=b) for p, s, b in zip(c.phases[:3], (0, 2, 3), (4, 2, 2)))
    return c
"""


@pytest.mark.slow
def test_pretrain_runs_resumes_and_exports(tmp_path, capsys):
    from memsearcher_jax.pretrain import BASE_MANIFEST, run_pretrain

    short = tmp_path / "short_base.py"
    short.write_text(SHORT_CONFIG.format(base=BASE_V8))
    overrides = [
        ("model.hidden_size", "32"), ("model.intermediate_size", "64"), ("model.num_layers", "1"),
        ("model.num_heads", "2"), ("model.num_kv_heads", "1"), ("model.head_dim", "16"),
        ("model.positional_heads", "((1,),)"),  # one positional head in the one layer left
        ("train.steps", "4"), ("train.save_every", "2"), ("train.probe_every", "2"),
        ("train.probe_items", "8"), ("train.final_probe_items", "8"), ("train.warmup", "1"), ("train.log_every", "1"),
        ("train.min_len", "512"), ("train.decay_steps", "0"), ("train.data_workers", "0"),
        ("train.pack_to_max_len", "false"), ("phases.2.learning_rate", "4e-4"),
        ("train.keep_period", "2"), ("train.output_dir", str(tmp_path / "run"))]
    cfg = load_config(str(short), overrides)
    assert cfg.model.positional_heads == ((1,),)
    first = run_pretrain(cfg)
    printed = capsys.readouterr().out
    assert "step 1/4 loss" in printed and "step 3/4 loss" in printed and "s/step" in printed  # the heartbeat
    assert 0.0 <= first["probe"]["accuracy"] <= 1.0 and set(first["probe"]["by_length"]) == {"2", "8", "16"}
    assert first["probe"]["multi"]["n"] == 8
    logged = [json.loads(x) for x in open(tmp_path / "run" / "logs" / "metrics.jsonl")]
    assert [r["step"] for r in logged] == [2, 4]
    assert {"probe_accuracy", "probe_8_passages", "probe_16_passages", "probe_multi"} <= set(logged[0])
    cfg.train.steps = 6
    run_pretrain(cfg)  # resumes at step 4
    logged = [json.loads(x)["step"] for x in open(tmp_path / "run" / "logs" / "metrics.jsonl")]
    assert logged == [2, 4, 6]
    # The last two checkpoints, and every keep_period-th one besides (max_to_keep alone leaves 4 and 6).
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints"), key=int) == ["2", "4", "6"]
    base = tmp_path / "run" / "base"
    manifest = json.loads((base / BASE_MANIFEST).read_text())
    assert manifest["tensors"]["model.embed_tokens.weight"][1] == 32
    assert set(manifest["files"]) >= {"model.safetensors", "config.json", "tokenizer.json", "reading_vocab.json"}
    assert ReadingVocab.exists(str(base))
    phases = manifest["phases"]
    assert [p["steps"] for p in phases] == ["0-2", "2-3", "3-6"] and [p["batch_size"] for p in phases] == [4, 2, 2]
    assert "long" not in phases[0]["curriculum"] and phases[1]["curriculum"]["bind"] > 0
    assert phases[0]["learning_rate"]["end"] == phases[1]["learning_rate"]["start"] > 0
    # the phase's own rate, here set on the command line (--config.phases.2.learning_rate)
    assert phases[2]["learning_rate"]["start"] == phases[2]["learning_rate"]["end"] == cfg.phases[2]["learning_rate"]
    assert cfg.phases[2]["learning_rate"] == 4e-4
    assert set(manifest["reading_probe"]["by_length"]) == {"2", "8", "16"} and "multi" in manifest["reading_probe"]
    assert manifest["progress_probe"]["n"] == 8
    assert manifest["pair_probe"]["n"] == 4 and 0.0 <= manifest["pair_probe"]["both"] <= 1.0
    from memsearcher_jax.pretrain import unpack_hits
    for figures in [*manifest["reading_probe"]["by_length"].values(), manifest["reading_probe"]["binding"]]:
        # each item's result is kept (the shipped-base test recomputes a sample of them exactly)
        assert unpack_hits(figures["hits"], figures["n"]).mean() == pytest.approx(figures["accuracy"])
    assert [h["step"] for h in manifest["history"]] == [2, 4, 6] and all(h["seconds"] > 0 for h in manifest["history"])
    assert manifest["pretraining"]["seconds"] == pytest.approx(sum(h["seconds"] for h in manifest["history"]))
    assert manifest["pretraining"]["machine"]["cores"] >= 1 and manifest["pretraining"]["machine"]["cpu"]

    # Any kept checkpoint can be read and probed without touching the run: the model is that step's
    # (the export, bf16, is step 6's weights rounded), and the report covers every length and pairs.
    from memsearcher_jax.cli import main
    from memsearcher_jax.models import from_pretrained
    from memsearcher_jax.pretrain import checkpoint_model
    before = _user_files(tmp_path / "run")
    step, _, _, at6 = checkpoint_model(cfg)
    _, _, _, at4 = checkpoint_model(cfg, 4)
    exported = np.asarray(from_pretrained(str(base)).layers.q_kernel[...])
    assert step == 6 and np.allclose(np.asarray(at6.layers.q_kernel[...]), exported, atol=1e-2)
    assert not np.allclose(np.asarray(at4.layers.q_kernel[...]), np.asarray(at6.layers.q_kernel[...]))
    capsys.readouterr()
    argv = ["pretrain", "--config", str(short),
            *(f"--config.{key}={value}" for key, value in overrides)]
    assert main(argv + ["--probe-step", "6", "--probe-items", "4"]) == 0
    table = capsys.readouterr().out
    assert "| 2 passages | 8 passages | 16 passages | pairs (both right) |" in table
    assert "| works_for |" in table and "| **all** |" in table and "step 6; multi" in table
    assert main(argv + ["--probe-step", "5"]) == 2
    assert "has no checkpoint 5; it has 2, 4, 6" in capsys.readouterr().err
    assert main(argv + ["--probe-step", "6", "--fresh"]) == 2
    assert "pass one" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's usage error, before anything is loaded
        main(argv + ["--probe-step", "6", "--probe-items", "0"])
    assert "--probe-items: must be >= 1, got 0" in capsys.readouterr().err
    assert _user_files(tmp_path / "run") == before  # probing wrote nothing, --fresh with it removed nothing

    # --fresh starts over in the same directory: the earlier run's checkpoints, log and export are
    # gone (a later resume must not pick up its step 6), and nothing else is touched.
    cfg.train.steps = 4
    run_pretrain(cfg, resume=False)
    run = tmp_path / "run"
    assert sorted(os.listdir(run / "checkpoints")) == ["2", "4"]
    assert [json.loads(x)["step"] for x in open(run / "logs" / "metrics.jsonl")] == [2, 4]
    assert json.loads((base / BASE_MANIFEST).read_text())["config"]["train"]["steps"] == 4


def test_pretrain_refuses_what_it_must_not_touch_before_any_work(tmp_path, monkeypatch):
    """--fresh never clears a directory holding files no pretraining run wrote; an export dir of
    the user's that is not empty is never written into; a resumed run with other vocabulary
    settings than its directory's vocabulary is refused. All before anything is built."""
    from memsearcher_jax.app.experiment import TrainConfigError
    from memsearcher_jax.errors import UserInputError
    from memsearcher_jax.pretrain import run as pretrain
    from memsearcher_jax.rules.run_dir import RUN_MARKER

    monkeypatch.setattr(pretrain, "init_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    monkeypatch.setattr(pretrain, "build_vocab", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    cfg = load_config(BASE_V8, [("train.output_dir", str(tmp_path / "run"))])
    run = tmp_path / "run"
    (run / "checkpoints" / "100").mkdir(parents=True)
    (run / "notes.txt").write_text("mine")
    with pytest.raises(UserInputError, match=r"notes\.txt.*no pretraining run wrote"):
        pretrain.run_pretrain(cfg, resume=False)
    assert (run / "notes.txt").exists() and (run / "checkpoints" / "100").is_dir()
    with pytest.raises(UserInputError, match=r"notes\.txt.*no .memsearcher-run marker"):  # resuming there too
        pretrain.run_pretrain(cfg)
    (run / "notes.txt").unlink()
    (run / RUN_MARKER).write_text("")  # a pretraining run's directory from here on

    mine = tmp_path / "my_models"
    mine.mkdir()
    (mine / "model.safetensors").write_text("someone else's weights")
    cfg.train.export_dir = str(mine)
    with pytest.raises(UserInputError, match=r"export_dir=.*my_models is not empty"):
        pretrain.run_pretrain(cfg)
    assert (mine / "model.safetensors").read_text() == "someone else's weights"

    cfg.train.export_dir = ""
    (run / "vocab").mkdir()
    (run / "vocab" / "reading_vocab.json").write_text(json.dumps({"seed": 0, "bpe_size": 640}))
    cfg.vocab.seed = 1
    with pytest.raises(UserInputError, match=r"vocab\.seed=1 but .* built with seed=0"):
        pretrain.run_pretrain(cfg)
    cfg.vocab.seed = 0  # a vocabulary from before wordings were recorded is v1
    cfg.vocab.wording = "v2"
    with pytest.raises(UserInputError, match=r"vocab\.wording=v2 but .* built with wording=v1"):
        pretrain.run_pretrain(cfg)
    cfg.vocab.wording = "v7"
    with pytest.raises(TrainConfigError, match=r"vocab\.wording must be one of v1, v2, got 'v7'"):
        pretrain.run_pretrain(cfg)


def _small_phased_config(**train):
    """base_v8's first three phases at steps 0-3, 3-6, 6-8 (batch 6, 4, 4), packed to each step's bucket."""
    cfg = _cut(load_config(BASE_V8), 3, 8)
    cfg.phases = tuple(dict(p, start=s, batch_size=b) for p, s, b in zip(cfg.phases, (0, 3, 6), (6, 4, 4)))
    cfg.train.update({"decay_steps": 0, "data_workers": 0, "pack_to_max_len": False})
    cfg.train.update(train)
    return cfg


def test_data_workers_build_the_very_batches_one_thread_builds(vocab_dir):
    """Rows depend on (seed, step) only: worker processes (spawned, not forked) hand back, in step
    order, exactly the arrays the trainer's own thread would build, across phase boundaries."""
    from memsearcher_jax.pretrain.batches import BatchMaker, _PoolPrefetch

    cfg = _small_phased_config(data_workers=2)
    here = BatchMaker(cfg, vocab_dir)
    ahead = _PoolPrefetch(cfg, vocab_dir, 2, 8, workers=2)
    try:
        for step in range(2, 8):  # phase 1 -> 2 at step 3, 2 -> 3 at step 6
            got_step, got = ahead.get()
            want = here(step)
            assert got_step == step
            for field in ("inputs", "targets", "weights", "positions", "segments", "loss_at", "loss_weights"):
                np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=f"{field} @ {step}")
    finally:
        ahead.close()


def _ignores_sigint(pid: int) -> bool:
    import signal

    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    return bool(mask & (1 << (signal.SIGINT - 1)))


def test_data_workers_leave_ctrl_c_to_the_trainer(vocab_dir):
    """Ctrl-C (or `timeout --signal=INT`) reaches every process of the group: the data workers
    ignore it (the trainer stops the pool), so an interrupted run prints no traceback per worker
    and a worker between two steps keeps building."""
    import multiprocessing
    import signal
    import time

    from memsearcher_jax.pretrain.batches import _PoolPrefetch

    cfg = _small_phased_config(data_workers=2)
    ahead = _PoolPrefetch(cfg, vocab_dir, 0, 8, workers=2)
    try:
        assert [ahead.get()[0] for _ in range(2)] == [0, 1]
        workers = multiprocessing.active_children()  # the pool's two workers: this test starts no other
        assert len(workers) == 2
        # Signal only once each worker has run its start-up (a worker still importing would die of
        # it either way): Linux lists a process's ignored signals in /proc/PID/status.
        deadline = time.time() + 60
        while not all(_ignores_sigint(w.pid) for w in workers) and time.time() < deadline:
            time.sleep(0.2)
        assert all(_ignores_sigint(w.pid) for w in workers), "a data worker does not ignore SIGINT"
        for w in workers:
            os.kill(w.pid, signal.SIGINT)
        time.sleep(1.0)
        for step in range(2, 8):
            # A worker that took the signal dies when it next wakes, and the step it held never
            # comes back: wait a bounded time instead of forever.
            ahead.pending[0].wait(30)
            assert ahead.pending[0].ready(), f"step {step} never came back from the data workers"
            assert ahead.get()[0] == step
        assert [w.exitcode for w in workers] == [None, None]
        # The same processes: none died and was replaced.
        assert sorted(p.pid for p in multiprocessing.active_children()) == sorted(w.pid for w in workers)
    finally:
        ahead.close()


def test_pack_to_max_len_packs_every_step_to_its_phase_length(vocab_dir):
    """pack_to_max_len: one width per phase (few programs to compile), the same sequences inside."""
    from memsearcher_jax.pretrain.batches import BatchMaker

    cfg = _small_phased_config()
    assert [p["max_len"] for p in cfg.phases] == [512, 1024, 1024]
    bucketed = BatchMaker(cfg, vocab_dir)
    cfg.train.pack_to_max_len = True
    full = BatchMaker(cfg, vocab_dir)
    widths = {step: full(step).inputs.shape[1] for step in range(8)}
    assert widths == {s: 512 if s < 3 else 1024 for s in range(8)}
    assert any(bucketed(s).inputs.shape[1] < widths[s] for s in range(8))  # without it, narrower buckets
    for step in (0, 5):  # the same loss tokens, however wide the rows
        a, b = bucketed(step), full(step)
        assert a.weights.sum() == b.weights.sum() > 0
        assert sorted(a.targets[a.weights > 0].tolist()) == sorted(b.targets[b.weights > 0].tolist())


def test_data_workers_must_be_a_count():
    from memsearcher_jax.pretrain import validate_pretrain

    cfg = load_config(BASE_V8)
    validate_pretrain(cfg)
    cfg.train.data_workers = -1
    with pytest.raises(ValueError, match="train.data_workers must be an integer >= 0"):
        validate_pretrain(cfg)


def test_a_failing_row_builder_raises_in_the_trainer_instead_of_hanging():
    from memsearcher_jax.pretrain.batches import _Prefetch

    def make(step):
        if step == 2:
            raise ModuleNotFoundError("No module named 'bm25s'")
        return step * 10

    ahead = _Prefetch(make, 0, 5)
    assert ahead.get() == (0, 0) and ahead.get() == (1, 10)
    with pytest.raises(ModuleNotFoundError, match="bm25s"):
        ahead.get()


def test_base_v8_layer1_heads_start_where_its_wording_puts_works_for(parts):
    """reading_v3 (wording v1) bound a value to its subject only through layer-1 heads, at the distances
    its init started them (5-8); works_for's value sat 4 tokens after its subject and read 20% at 8
    passages (docs/lab/2026-11-27-main-job-timed-works-for-binding.md). Wording v2 ("works for the company
    called", "makes the product called") moves works_for and product to distances base_v8's layer-1 heads start at.
    (`parts` is reading_v3's vocabulary: seed 0, wording v1; the shipped base's is v2.)"""
    from memsearcher_jax.bases import DEFAULT_BASE
    from memsearcher_jax.data.synthetic import generate_world, one_hop_templates

    def distances(vocab, tok) -> dict:
        world = generate_world(0, num_entities=30, heldout_fraction=0.0, names=vocab.pool("reserved"),
                               wording=vocab.wording)
        out = {}
        for etype, relations in one_hop_templates(vocab.wording).items():
            subject = next(name for name, e in world.entities.items() if e["type"] == etype)
            for rel, (_, _, sentence) in relations.items():
                value = world.entities[subject][rel]
                ids = tok(sentence.format(s=subject, a=value))["input_ids"]
                out[rel] = ids.index(vocab.ids[value]) - ids.index(vocab.ids[subject])
        return out

    vocab, tok, _ = parts
    v1 = distances(vocab, tok)
    assert v1["works_for"] == 4 and v1["occupation"] == 6, v1  # the measured case
    v2 = distances(ReadingVocab.load(DEFAULT_BASE), load_tokenizer(DEFAULT_BASE))
    layer1 = load_config(BASE_V8).model.positional_heads[1]
    assert v1["works_for"] not in layer1 and v1["product"] not in layer1   # what left them unbound
    assert v2["works_for"] in layer1 and v2["product"] in layer1, v2
    assert {r: d for r, d in v2.items() if r not in ("works_for", "product")} == \
        {r: d for r, d in v1.items() if r not in ("works_for", "product")}   # the other sentences as they were
