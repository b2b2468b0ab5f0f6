"""The reading probes: items over reserved names (never seen in pretraining), and their scoring.

An item is (context ids ending in `\\boxed{`, the answer's token id or ids, a label); `reading_probe`
scores a model on items greedily, teacher-forced. The sets: by context length (2, 8, 16 passages),
multi-objective, binding (same-type distractors), binding pairs, and the copy drill. Progress sets
come from seed + 1000 + ..., checkpoint checks from seed + CHECK_SEED + ..., the figure a base ships
with from seed + FINAL_SEED + ...: disjoint items.
"""
from __future__ import annotations

import functools
import random

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.data.synthetic import generate_world
from memsearcher_jax.data.tokenizer import load_tokenizer
from memsearcher_jax.data.vocab import ReadingVocab
from memsearcher_jax.models import Qwen2, from_pretrained
from memsearcher_jax.pretrain.curriculum import Pieces, Row, cloze_row, context_row, passage_title, repeat_row

# Entities per world a probe draws its items from. Equal to CurriculumConfig.world_entities's default, but
# its own constant: probe items (and every stored probe figure) must not move if the training default does.
PROBE_WORLD_ENTITIES = 30


def probe_items(vocab: ReadingVocab, builder: PromptBuilder, n: int, seed: int = 1234, n_passages: int = 2,
                pool: str = "reserved", same_type: bool = False) -> list[tuple[list[int], int, str]]:
    """Reading-probe items over names from `pool` (default: reserved, never seen in pretraining).

    Each item: (context ids ending in `\\boxed{`, the answer's first token id, the relation).
    The answer is a single token for every relation (names and values are whole tokens).
    same_type: every other shown passage is about an entity of the subject's type, so it states
    the asked relation too, with a value of the same kind: only binding the value to its subject
    answers (a reader that matches the relation alone scores 1 / n_passages).
    """
    rng = random.Random(seed)
    pieces = Pieces(builder)
    names = vocab.pool(pool)
    items = []
    while len(items) < n:
        world = generate_world(rng.randrange(2 ** 31), num_entities=PROBE_WORLD_ENTITIES, heldout_fraction=0.0,
                               names=names, wording=vocab.wording)
        subjects = sorted({r["subject"] for r in world.train if r["hops"] == 1})
        for _ in range(8):
            subject = rng.choice(subjects)
            if same_type:
                row = _same_type_row(world, rng, pieces, subject, n_passages)
            else:
                row = cloze_row(world, rng, pieces, n_passages, 1, one_question_about=subject)
            items.append(_answer_item(row, row.questions[0]["relation"]))
    return items[:n]


def _answer_item(row: Row, relation: str) -> tuple[list[int], int, str]:
    """A one-question row as a probe item: (context ids through the answer's lead-in `\\boxed{`,
    the answer's first token, the relation)."""
    target = [t for t, m in zip(row.response_ids, row.loss_mask) if m][0]
    lead = [t for t, m in zip(row.response_ids, row.loss_mask) if not m]
    return row.prompt_ids + lead, target, relation


def _same_type_row(world, rng: random.Random, pieces: Pieces, subject: str, n_passages: int) -> Row:
    """The subject's passage and n_passages - 1 others about entities of its type (fewer if the
    world has fewer), shuffled; one 1-hop question about the subject."""
    kind = world.entities[subject]["type"]
    passage_of = {passage_title(p): p for p in world.corpus}
    peers = sorted(n for n, e in world.entities.items() if e["type"] == kind and n != subject)
    shown = [passage_of[subject]] + [passage_of[n] for n in rng.sample(peers, min(n_passages - 1, len(peers)))]
    rng.shuffle(shown)
    question = rng.choice([r for r in world.train if r["hops"] == 1 and r["subject"] == subject])
    return context_row(world, pieces, shown, [[question]], "probe")


def pair_probe_items(vocab: ReadingVocab, builder: PromptBuilder, n: int, seed: int = 4040,
                     pool: str = "reserved") -> list[tuple[list[int], int, str]]:
    """Binding pairs: n pairs of items (2n in all, a pair's two items next to each other) over one
    context of two passages about entities of one type, whose values of the asked relation differ;
    the first item asks about one entity, the second about the other. A reader that answers from
    the relation alone, whoever the question names, gets at most one of each pair right; only one
    that binds each value to its subject gets both (`pair_probe`)."""
    rng = random.Random(seed)
    pieces = Pieces(builder)
    names = vocab.pool(pool)
    items: list[tuple[list[int], int, str]] = []
    while len(items) < 2 * n:
        world = generate_world(rng.randrange(2 ** 31), num_entities=PROBE_WORLD_ENTITIES, heldout_fraction=0.0,
                               names=names, wording=vocab.wording)
        one_hop = {(r["subject"], r["relation"]): r for r in world.train if r["hops"] == 1}
        passage_of = {passage_title(p): p for p in world.corpus}
        for _ in range(8):
            a, relation = rng.choice(sorted(one_hop))
            kind = world.entities[a]["type"]
            peers = sorted(s for (s, r), q in one_hop.items() if r == relation and s != a
                           and world.entities[s]["type"] == kind
                           and q["golden_answers"][0] != one_hop[a, relation]["golden_answers"][0])
            if not peers:
                continue
            b = rng.choice(peers)
            shown = [passage_of[a], passage_of[b]]
            rng.shuffle(shown)
            for subject in (a, b):
                row = context_row(world, pieces, shown, [[one_hop[subject, relation]]], "probe")
                items.append(_answer_item(row, relation))
    return items[:2 * n]


def copy_probe_items(vocab: ReadingVocab, builder: PromptBuilder, n: int, seed: int = 777,
                     pool: str = "reserved",
                     run_tokens: tuple[int, int] = (16, 48)) -> list[tuple[list[int], int, str]]:
    """The copy (induction) skill alone: repeat drills over `pool` names and the values, each cut
    before one random word of its second copy. Each item: (context ids, that word's id, "copy").
    Reading needs this circuit; a base can reach a middling reading probe without it (the second
    base: 60% at 2 passages with 6% here, docs/lab/2026-11-25-second-base-no-copy-circuit.md)."""
    rng = random.Random(seed)
    pieces = Pieces(builder)
    words = [w for names in vocab.pool(pool).values() for w in names] + [v for vs in vocab.values.values() for v in vs]
    items = []
    for _ in range(n):
        row = repeat_row(rng, pieces, words, rng.randint(*run_tokens))
        at = rng.choice([i for i, m in enumerate(row.loss_mask) if m])
        items.append((row.prompt_ids + row.response_ids[:at], row.response_ids[at], "copy"))
    return items


def multi_probe_items(vocab: ReadingVocab, builder: PromptBuilder, n: int, seed: int = 4321, n_passages: int = 4,
                      pool: str = "reserved") -> list[tuple[list[int], list[int], str]]:
    """Multi-objective probe items: n_passages shown, one `<question> q1; q2 </question>` about
    two different shown subjects (1-hop each). Each item: (context ids ending in `\\boxed{`,
    the answer's tokens `a1; a2`, "multi"); right when greedy decoding writes all of them."""
    rng = random.Random(seed)
    pieces = Pieces(builder)
    names = vocab.pool(pool)
    items = []
    while len(items) < n:
        world = generate_world(rng.randrange(2 ** 31), num_entities=PROBE_WORLD_ENTITIES, heldout_fraction=0.0,
                               names=names, wording=vocab.wording)
        one_hop = {}
        for r in world.train:
            if r["hops"] == 1:
                one_hop.setdefault(r["subject"], []).append(r)
        passage_of = {passage_title(p): p for p in world.corpus}  # once per world, not once per item
        for _ in range(8):
            a, b = rng.sample(sorted(one_hop), 2)
            others = [p for p in world.corpus if passage_title(p) not in (a, b)]
            shown = [passage_of[a], passage_of[b]] + rng.sample(others, n_passages - 2)
            rng.shuffle(shown)
            row = context_row(world, pieces, shown, [[rng.choice(one_hop[a]), rng.choice(one_hop[b])]], "multi")
            lead = [t for t, m in zip(row.response_ids, row.loss_mask) if not m]
            answer = pieces.enc("; ".join(q["golden_answers"][0] for q in row.questions))
            assert [t for t, m in zip(row.response_ids, row.loss_mask) if m][:len(answer)] == answer
            items.append((row.prompt_ids + lead, answer, "multi"))
    return items[:n]


@functools.partial(jax.jit, static_argnums=(0, 4))
def _last_tokens_argmax(graphdef, params, ids, mask, n_last: int):
    logits = nnx.merge(graphdef, params)(ids, attention_mask=mask)
    return jnp.argmax(logits[:, -n_last:, :], axis=-1)


def reading_probe(model: Qwen2, items: list[tuple[list[int], int | list[int], str]], pad_id: int,
                  batch: int = 64) -> dict:
    """Greedy accuracy of the answer (the tokens after `\\boxed{`) on probe items.

    An item's target is one token id or a list of them (a multi-objective answer `a1; a2}`);
    a list is scored teacher-forced, right when every token is the argmax (= greedy decoding
    writes it all). Items are left-padded to one length, so the probe compiles once per length;
    long items go in smaller batches (the logits of a batch stay ~16K positions). Returns
    {"accuracy", "by_relation": {relation: accuracy}, "n", "hits": each item's result (`pack_hits`)}.
    """
    graphdef, params = nnx.split(model, nnx.Param)
    targets = [list(np.atleast_1d(t)) for _, t, _ in items]
    seqs = [list(ids) + t[:-1] for (ids, _, _), t in zip(items, targets)]
    n_last = max(map(len, targets))
    width = -(-max(map(len, seqs)) // 64) * 64
    batch = max(1, min(batch, 16384 // width))
    hits, rel_hits = [], {}
    for s in range(0, len(items), batch):
        ids = np.full((batch, width), pad_id, np.int32)
        mask = np.zeros((batch, width), bool)
        for i, seq in enumerate(seqs[s:s + batch]):
            ids[i, width - len(seq):] = seq
            mask[i, width - len(seq):] = True
        mask[len(seqs[s:s + batch]):, -1] = True  # filler rows: one real token, ignored
        pred = np.asarray(jax.device_get(_last_tokens_argmax(graphdef, params, ids, mask, n_last)))
        for i, (target, (_, _, rel)) in enumerate(zip(targets[s:s + batch], items[s:s + batch])):
            ok = pred[i, n_last - len(target):].tolist() == target
            hits.append(ok)
            rel_hits.setdefault(rel, []).append(ok)
    return {"accuracy": float(np.mean(hits)), "n": len(hits),
            "by_relation": {r: float(np.mean(v)) for r, v in sorted(rel_hits.items())},
            "hits": pack_hits(hits)}


def pack_hits(hits) -> str:
    """Per-item right / wrong, in item order, as hex (a manifest keeps which items a base reads, so a
    check can recompute any subset of them exactly instead of all)."""
    return np.packbits(np.asarray(hits, bool)).tobytes().hex()


def unpack_hits(packed: str, n: int) -> np.ndarray:
    """`pack_hits`'s bools back, the first n."""
    return np.unpackbits(np.frombuffer(bytes.fromhex(packed), np.uint8))[:n].astype(bool)


def pair_hits(hits: np.ndarray, relations: list[str]) -> dict:
    """`pair_probe_items`' pairs scored from their items' hits (a pair's two items next to each
    other): {"both": share of pairs with both answers right, "by_relation": {relation: that share},
    "n": pairs}."""
    hits = np.asarray(hits, bool)
    if len(hits) != len(relations) or len(hits) % 2:
        raise ValueError(f"pair_hits: {len(hits)} hits and {len(relations)} relations; need one per item, "
                         "items in pairs")
    both = hits[0::2] & hits[1::2]
    by_relation: dict[str, list[bool]] = {}
    for ok, relation in zip(both, relations[0::2]):
        by_relation.setdefault(relation, []).append(bool(ok))
    return {"both": float(both.mean()) if len(both) else 0.0, "n": int(len(both)),
            "by_relation": {r: float(np.mean(v)) for r, v in sorted(by_relation.items())}}


def pair_probe(base_dir: str, n: int = 256, seed: int = 4040) -> dict:
    """A stored base on `pair_probe_items` (reserved names): the share of two-entity contexts
    where it answers the asked relation right for both entities, overall and by relation. A
    relation read from the question's relation alone, whoever it names, scores ~0 here while
    reading about half of its single questions right (docs/lab/2026-11-27-works-for-answer-ignores-subject.md)."""
    builder = probe_builder(base_dir)
    return pair_report(from_pretrained(base_dir), ReadingVocab.load(base_dir), builder, n, seed)


def pair_report(model: Qwen2, vocab: ReadingVocab, builder: PromptBuilder, n: int, seed: int) -> dict:
    """`pair_hits` of a model on n `pair_probe_items` pairs."""
    items = pair_probe_items(vocab, builder, n, seed=seed)
    result = reading_probe(model, items, builder.pad_id)
    return pair_hits(unpack_hits(result["hits"], len(items)), [rel for _, _, rel in items])


# Context lengths the probe reports (passages shown; 16 are ~900 tokens), and the multi-objective
# item's passages. Progress items come from seed + 1000 + ..., final items from seed + FINAL_SEED
# + ...: the final figure is measured on items nothing during pretraining looked at.
PROBE_PASSAGES = (2, 8, 16)
MULTI_PASSAGES = 4
FINAL_SEED = 500_000
# Checks of a run's checkpoints (`probe_checkpoint`) draw from seed + CHECK_SEED + ...: items neither
# the progress probe nor the final probe uses, so looking at them never chooses the shipped figure's items.
CHECK_SEED = 250_000
# Sets reported beside the lengths: multi-objective items, and 2-passage items whose other passage is
# about an entity of the subject's type (binding: matching the relation alone scores 50%).
SIDE_SETS = ("multi", "binding")


def probe_sets(vocab: ReadingVocab, builder: PromptBuilder, n: int, seed: int, final: bool = False) -> dict:
    """{"2": items, "8": items, "16": items, "multi": items, "binding": items} on reserved names. Progress sets
    (final=False) start at seed + 1000 (the 2-passage set is the one every earlier base was
    probed with); final sets at seed + FINAL_SEED, disjoint seeds."""
    base = seed + (FINAL_SEED if final else 1000)
    sets = {str(k): probe_items(vocab, builder, n, seed=base if k == 2 else base + 100 * k, n_passages=k)
            for k in PROBE_PASSAGES}
    sets["multi"] = multi_probe_items(vocab, builder, n, seed=base + 99, n_passages=MULTI_PASSAGES)
    sets["binding"] = probe_items(vocab, builder, n, seed=base + 98, n_passages=2, same_type=True)
    return sets


def probe_report(model: Qwen2, sets: dict, pad_id: int) -> dict:
    """Accuracy by context length (and by relation within each) and of the multi-objective items;
    "accuracy" is over every single-question item, "worst_relation" the lowest relation at any length."""
    by_length = {k: reading_probe(model, items, pad_id) for k, items in sets.items() if k not in SIDE_SETS}
    report = {"by_length": by_length,
              "accuracy": float(np.mean([r["accuracy"] for r in by_length.values()])),
              "worst_relation": min(a for r in by_length.values() for a in r["by_relation"].values())}
    for k in SIDE_SETS:
        if k in sets:
            report[k] = reading_probe(model, sets[k], pad_id)
    return report


def base_probe(base_dir: str, n: int = 512, seed: int = 0) -> dict:
    """The progress probe's 2-passage figure for a base directory as it is stored (bf16 weights,
    read in float32): reserved names only, the same items the pretraining run probed with
    (seed + 1000). The shipped figure is `final_probe`'s."""
    builder = probe_builder(base_dir)
    items = probe_items(ReadingVocab.load(base_dir), builder, n, seed=seed + 1000, pool="reserved")
    return reading_probe(from_pretrained(base_dir), items, builder.pad_id)


def final_probe(base_dir: str, n: int = 512, seed: int = 0) -> dict:
    """The figure a base ships with: the stored weights (bf16, read in float32) on the FINAL probe
    sets (seed + FINAL_SEED: items no progress probe, checkpoint choice or stopping rule saw),
    by context length (2, 8, 16 passages) and relation, plus the multi-objective items."""
    builder, sets = final_probe_sets(base_dir, n, seed)
    return probe_report(from_pretrained(base_dir), sets, builder.pad_id)


def final_probe_sets(base_dir: str, n: int = 512, seed: int = 0) -> tuple[PromptBuilder, dict]:
    """`final_probe`'s items for a base directory ({set name: items}) and the prompt builder
    that made them (its pad_id pads the probe)."""
    builder = probe_builder(base_dir)
    return builder, probe_sets(ReadingVocab.load(base_dir), builder, n, seed, final=True)


def probe_builder(base_dir: str) -> PromptBuilder:
    """The prompt builder every probe of a stored base formats its items with (the agent's
    compact prompts, two passages per search)."""
    return PromptBuilder(load_tokenizer(base_dir), default_top_n=2, style="compact")


def probe_table(report: dict) -> str:
    """`probe_checkpoint`'s report as a markdown table: a row per relation, a column per context
    length and one for binding pairs (% right), then the overall row and the side sets."""
    lengths = sorted(report["by_length"], key=int)
    pairs = report["pairs"]["by_relation"]
    relations = sorted({r for k in lengths for r in report["by_length"][k]["by_relation"]} | set(pairs))
    pct = lambda x: "" if x is None else f"{100 * x:.1f}"
    lines = [f"| relation | {' | '.join(f'{k} passages' for k in lengths)} | pairs (both right) |",
             "|---|" + "---:|" * (len(lengths) + 1)]
    for r in relations:
        cells = [pct(report["by_length"][k]["by_relation"].get(r)) for k in lengths] + [pct(pairs.get(r))]
        lines.append(f"| {r} | {' | '.join(cells)} |")
    cells = [pct(report["by_length"][k]["accuracy"]) for k in lengths] + [pct(report["pairs"]["both"])]
    lines.append(f"| **all** | {' | '.join(cells)} |")
    side = ", ".join(f"{k} {pct(report[k]['accuracy'])}" for k in SIDE_SETS if k in report)
    return "\n".join(lines) + f"\n\nstep {report['step']}; {side}"
