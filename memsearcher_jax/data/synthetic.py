"""A synthetic closed world for proving the agent learns: people, cities, companies, countries.

No QA data or Wikipedia can be downloaded here, so a tiny model is trained on a world of made-up
entities whose facts live only in a passage corpus. Everything is templated and low-entropy, the
names are unique made-up words (so BM25 finds an entity's passage from its name), and questions
cannot be answered without retrieval:

- 1-hop: "What year was Bolin born?" -> the fact sits in Bolin's passage.
- 2-hop: "In which city was the founder of Zumatek born?" -> Zumatek's passage names the founder
  (the intermediate entity), whose own passage holds the answer. The answer never appears in the
  first passage, so both hops are needed.

Split rule (no memorisation shortcut): entities are assigned to a train or held-out group. A
question goes to `train` only if every entity whose fact it reads (subject, and intermediate for
2-hop) is in the train group; otherwise to `heldout`. So every held-out question reads at least
one fact that no training question ever uses, and the two splits share no question.

Question rows: {"id", "question", "golden_answers", "hops", "gold_passage_ids" (one per hop,
in hop order), "intermediate" ("" for 1-hop), "subject", "relation", "facts" (the supporting
sentence of each hop), "queries" (a search query per hop that retrieves that hop's passage)}.

Multi-objective questions (MEM1's long-horizon task, `world.objectives=N`): `join_objectives`
asks N questions of one split at once ("q1; q2; ..."); the answer lists N answers separated by
";". Such a row is {"id", "question", "golden_answers" (one alias list per objective, in order),
"objectives" (the N rows asked, each with all its own fields)}.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
from typing import Any

from memsearcher_jax.runtime.jsonl import read_jsonl, write_jsonl

ONSETS = "bdfgklmnprstvz"
VOWELS = "aeiou"
CODAS = "nrsl"
# Suffixes give each entity type a recognisable shape (helps a tiny model know what an answer
# looks like) while names stay unique whole words for retrieval.
SUFFIXES = {
    "city": ("dor", "ton", "var"),
    "company": ("tek", "corp", "lux"),
    "country": ("nia", "via", "ria"),
}
OCCUPATIONS = ("painter", "farmer", "doctor", "teacher", "baker", "pilot", "sailor", "writer",
               "singer", "lawyer")
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "white", "black", "pink", "grey")
PRODUCTS = ("lamps", "boats", "shoes", "clocks", "bikes", "tables", "radios", "hats", "bells",
            "kites")
LANDMARKS = ("bridges", "markets", "towers", "gardens", "harbours", "castles", "fountains",
             "museums")
BIRTH_YEARS = tuple(str(y) for y in range(1900, 1980))
YEARS = tuple(str(y) for y in range(1900, 2020))  # founding years are birth years + 20..40

# One template per relation: (question, search query, supporting sentence). Placeholders:
# {s} subject, {a} answer. The sentence template is also how the passage states the fact.
ONE_HOP = {
    "person": {
        "born_year": ("What year was {s} born?", "{s} born year", "{s} was born in the year {a}."),
        "born_in": ("In which city was {s} born?", "{s} born city", "{s} was born in the city of {a}."),
        "works_for": ("Which company does {s} work for?", "{s} works for company", "{s} works for {a}."),
        "occupation": ("What job does {s} have?", "{s} job", "{s} has the job of {a}."),
        "colour": ("What is the favourite colour of {s}?", "{s} favourite colour",
                   "The favourite colour of {s} is {a}."),
    },
    "city": {
        "country": ("In which country is {s}?", "{s} city country", "{s} is a city in the country of {a}."),
        "known_for": ("What is {s} known for?", "{s} known for", "{s} is known for its {a}."),
    },
    "company": {
        "founder": ("Who founded {s}?", "{s} founded by", "{s} is a company founded by {a}."),
        "founded_year": ("What year was {s} founded?", "{s} founded year", "{s} was founded in the year {a}."),
        "based_in": ("In which city is {s} based?", "{s} based city", "{s} is based in the city of {a}."),
        "product": ("What does {s} make?", "{s} makes", "{s} makes {a}."),
    },
}
# Wordings of the world. "v1" is ONE_HOP as above, the world every base up to reading_v3 read. "v2"
# names the works_for and product values after "... called": in v1 their value sits one or two
# tokens after the subject, and no base bound works_for that way
# (docs/lab/2026-11-27-works-for-binds-8-tokens-after-subject.md).
# A reading base records its wording in its vocabulary (`data.vocab`); worlds built for it use it.
WORDINGS = ("v1", "v2")
REWORDED = {"v2": {("person", "works_for"): "{s} works for the company called {a}.",
                   ("company", "product"): "{s} makes the product called {a}."}}


def one_hop_templates(wording: str = "v1") -> dict[str, dict[str, tuple[str, str, str]]]:
    """ONE_HOP in a wording (WORDINGS): the same relations, questions and queries; some sentences differ."""
    if wording not in WORDINGS:
        raise ValueError(f"unknown world wording {wording!r}; expected one of {', '.join(WORDINGS)}")
    table = {etype: dict(relations) for etype, relations in ONE_HOP.items()}
    for (etype, relation), sentence in REWORDED.get(wording, {}).items():
        question, query, _ = table[etype][relation]
        table[etype][relation] = (question, query, sentence)
    return table


# Passage sentence order per type (fixed: lower entropy for a tiny model).
PASSAGE_ORDER = {
    "person": ("born_year", "born_in", "works_for", "occupation", "colour"),
    "city": ("country", "known_for"),
    "company": ("founder", "founded_year", "based_in", "product"),
}
# 2-hop: (subject type, bridge relation, second relation, question template).
TWO_HOP = (
    ("company", "founder", "born_in", "In which city was the founder of {s} born?"),
    ("company", "founder", "born_year", "What year was the founder of {s} born?"),
    ("company", "founder", "occupation", "What job does the founder of {s} have?"),
    ("company", "based_in", "country", "In which country is {s} based?"),
    ("person", "works_for", "founder", "Who founded the company that {s} works for?"),
    ("person", "works_for", "based_in", "In which city is the company that {s} works for based?"),
    ("person", "works_for", "product", "What does the company that {s} works for make?"),
    ("person", "born_in", "country", "In which country was {s} born?"),
    ("person", "born_in", "known_for", "What is the city where {s} was born known for?"),
)
# Answer aliases by the answer's entity type (SQuAD-normalised F1 picks the best one).
ALIAS_SUFFIX = {"city": " city", "company": " company", "country": " country"}


@dataclasses.dataclass
class World:
    """The generated world. `entities[name] = {"type": ..., relation: value, ...}`."""

    seed: int
    entities: dict[str, dict[str, Any]]
    corpus: list[dict[str, str]]  # {"id", "contents": "title\ntext"}
    train: list[dict[str, Any]]
    heldout: list[dict[str, Any]]

    def split(self, name: str) -> list[dict[str, Any]]:
        if name not in ("train", "heldout"):
            raise ValueError(f"unknown synthetic split {name!r}; expected 'train' or 'heldout'")
        return self.train if name == "train" else self.heldout

    def name_pieces(self) -> dict[str, list[str]]:
        """Each made-up name split into its syllables ("Gebin" -> ["Ge", "bin"]).

        The tokenizer learns names only as these shared pieces, so a held-out name is a sequence
        of tokens the model has produced in training, not a never-seen whole-name token.
        """
        return {name: split_name(name) for name in self.entities}

    def texts(self) -> list[str]:
        """All text of the world (passages, questions, answers), e.g. for tokenizer training."""
        out = [p["contents"] for p in self.corpus]
        for row in self.train + self.heldout:
            out.append(row["question"])
            out.extend(row["golden_answers"])
            out.extend(row["queries"])
        return out


def make_name(rng: random.Random, kind: str, taken: set[str]) -> str:
    """A fresh made-up name of an entity type (CVCV + coda or type suffix), added to `taken`."""
    for _ in range(10_000):
        n_syll = 2
        word = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(n_syll))
        if kind == "person":
            word += rng.choice(CODAS)
        else:
            word += rng.choice(SUFFIXES[kind])
        name = word.capitalize()
        if name.lower() not in taken:
            taken.add(name.lower())
            return name
    raise RuntimeError(f"could not find a fresh {kind} name; the world is too large for the syllable set")


def split_name(name: str) -> list[str]:
    # Names are CV CV + (coda | suffix): person "Gebin" -> Ge|bin, others "Lopaton" -> Lo|pa|ton.
    return [name[:2], name[2:]] if len(name) == 5 else [name[:2], name[2:4], name[4:]]


def template_words(wording: str = "v1") -> set[str]:
    """Every word of the templates and attribute values (lower case): names must avoid them."""
    words: set[str] = set()
    texts = [t for rels in one_hop_templates(wording).values() for tpl in rels.values() for t in tpl]
    texts += [t[3] for t in TWO_HOP]
    texts += list(OCCUPATIONS + COLOURS + PRODUCTS + LANDMARKS)
    for t in texts:
        for w in t.replace("?", " ").replace(".", " ").split():
            if not w.startswith("{"):
                words.add(w.lower())
    return words


def template_texts(wording: str = "v1") -> list[str]:
    """Every question, query and sentence template with its blanks left empty: the text around
    names and values (for training a tokenizer's merges)."""
    texts = [t.format(s="", a="") for rels in one_hop_templates(wording).values() for tpl in rels.values() for t in tpl]
    texts += [t[3].format(s="") for t in TWO_HOP]
    return texts


def wording_fingerprint(wording: str = "v1") -> str:
    """A hash of everything that words the world: the templates, the passages' sentence order, the
    value lists and name shapes. Caches of generated worlds key on it, so an edited template never
    reuses a world written in the old wording."""
    parts = [one_hop_templates(wording), PASSAGE_ORDER, TWO_HOP, ALIAS_SUFFIX, SUFFIXES, ONSETS, VOWELS, CODAS,
             OCCUPATIONS, COLOURS, PRODUCTS, LANDMARKS, BIRTH_YEARS, YEARS]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _aliases(value: str, value_type: str) -> list[str]:
    if value_type in ALIAS_SUFFIX:
        return [value, value + ALIAS_SUFFIX[value_type]]
    return [value]


HELDOUT_BY = ("entity", "fact", "question")

# The entity type of each relation's value ("" for plain attribute values).
VALUE_TYPE = {"born_in": "city", "works_for": "company", "founder": "person", "based_in": "city",
              "country": "country"}


def generate_world(
    seed: int,
    num_entities: int = 100,
    num_countries: int = 6,
    heldout_fraction: float = 0.15,
    heldout_by: str = "entity",
    names: dict[str, list[str]] | None = None,
    wording: str = "v1",
) -> World:
    """Build a world deterministically from `seed`.

    num_entities people + cities + companies (60% / 15% / 25%, at least 2 each); countries are
    answer-only entities. heldout_by="entity": heldout_fraction of the people/cities/companies
    form the held-out group and every question reading one of their facts is held out (the
    module docstring's rule; held-out names never appear in a training question).
    heldout_by="fact": heldout_fraction of the facts (entity, relation) form the held-out group
    and every question reading one of them is held out: no training question reads a held-out
    fact (so its sentence is never a training target), but held-out questions name entities
    that training questions also ask about.
    heldout_by="question": heldout_fraction of the questions, drawn at random, are held out: the
    splits share no question, but a held-out question's facts are usually read by training
    questions too (a 2-hop held-out question composes facts that 1-hop training questions ask).
    It measures new questions over a known world, not reading unseen facts.
    names: optional candidate names per type ("person", "city", "company", "country"), e.g. a
    reading vocabulary's reserved pool (`data.vocab`); the world samples its entities from them
    instead of making up new ones.
    wording: the sentences' wording (WORDINGS); a reading base's vocabulary says which it read.
    """
    templates = one_hop_templates(wording)
    if num_entities < 6:
        raise ValueError(f"num_entities={num_entities}: need at least 6 (2 people, 2 cities, 2 companies)")
    if heldout_by not in HELDOUT_BY:
        raise ValueError(f"heldout_by must be one of {HELDOUT_BY}, got {heldout_by!r}")
    # One stream, drawn in this order: names, entities, held-out group, the final shuffles.
    rng = random.Random(seed)
    n_city = max(2, round(0.15 * num_entities))
    n_company = max(2, round(0.25 * num_entities))
    n_person = max(n_company, num_entities - n_city - n_company)  # every company needs a founder
    drawn = _draw_names(rng, {"country": num_countries, "city": n_city, "company": n_company, "person": n_person},
                        names, wording)
    countries, cities, companies, people = (drawn[k] for k in ("country", "city", "company", "person"))
    ent = _make_entities(rng, countries, cities, companies, people)
    corpus, pid = _passages(ent, cities + companies + people, templates)
    heldout_group = _heldout_entities(rng, (people, cities, companies), heldout_fraction)
    rows = [(name in heldout_group, row)
            for name, row in _one_hop_rows(ent, people + cities + companies, pid, templates)]
    rows += [(name in heldout_group or mid in heldout_group, row)
             for name, mid, row in _two_hop_rows(ent, people, companies, pid, corpus, templates)]
    if heldout_by == "fact":
        rows = _split_by_fact(rows, seed, heldout_fraction)
    elif heldout_by == "question":
        rows = _split_by_question(rows, seed, heldout_fraction)
    train, heldout = [], []
    for is_heldout, row in rows:
        split = heldout if is_heldout else train
        row["id"] = f"{'heldout' if is_heldout else 'train'}-{len(split)}"
        split.append(row)
    # Shuffle within splits so 1-hop and 2-hop questions interleave; ids keep generation order.
    rng.shuffle(train)
    rng.shuffle(heldout)
    return World(seed=seed, entities=ent, corpus=corpus, train=train, heldout=heldout)


def _draw_names(rng: random.Random, counts: dict[str, int], names: dict[str, list[str]] | None,
                wording: str = "v1") -> dict[str, list[str]]:
    """`counts[kind]` names per kind: made up (avoiding template words), or sampled from `names`."""
    if names is None:
        taken = template_words(wording)
        return {kind: [make_name(rng, kind, taken) for _ in range(n)] for kind, n in counts.items()}
    short = {k: (n, len(names.get(k, ()))) for k, n in counts.items() if n > len(names.get(k, ()))}
    if short:
        raise ValueError(f"names: the world needs more names than given (type: (needed, given)) {short}")
    return {kind: rng.sample(list(names[kind]), n) for kind, n in counts.items()}


def _make_entities(rng: random.Random, countries: list[str], cities: list[str], companies: list[str],
                   people: list[str]) -> dict[str, dict[str, Any]]:
    """Every entity's type and attributes; each company's founder is a distinct person."""
    ent: dict[str, dict[str, Any]] = {}
    for c in countries:
        ent[c] = {"type": "country"}
    for c in cities:
        ent[c] = {"type": "city", "country": rng.choice(countries), "known_for": rng.choice(LANDMARKS)}
    for p in people:
        ent[p] = {"type": "person", "born_year": rng.choice(BIRTH_YEARS), "born_in": rng.choice(cities),
                  "works_for": rng.choice(companies), "occupation": rng.choice(OCCUPATIONS),
                  "colour": rng.choice(COLOURS)}
    founders = rng.sample(people, len(companies))
    for y, f in zip(companies, founders):
        ent[y] = {"type": "company", "founder": f,
                  "founded_year": str(int(ent[f]["born_year"]) + rng.randint(20, 40)),
                  "based_in": rng.choice(cities), "product": rng.choice(PRODUCTS)}
    return ent


def _passages(ent: dict[str, dict[str, Any]], subjects: list[str],
              templates: dict) -> tuple[list[dict[str, str]], dict[str, str]]:
    """One passage per non-country entity (ids are strings like the wiki-18 corpus), and each
    entity's passage id."""
    corpus: list[dict[str, str]] = []
    pid: dict[str, str] = {}
    for name in subjects:
        e = ent[name]
        sents = [templates[e["type"]][rel][2].format(s=name, a=e[rel]) for rel in PASSAGE_ORDER[e["type"]]]
        pid[name] = str(len(corpus))
        corpus.append({"id": pid[name], "contents": name + "\n" + " ".join(sents)})
    return corpus, pid


def _heldout_entities(rng: random.Random, groups: tuple[list[str], ...], fraction: float) -> set[str]:
    """heldout_by="entity": `fraction` of each group (at least one when fraction > 0)."""
    held = set()
    for group in groups:
        k = max(1, round(fraction * len(group))) if fraction > 0 else 0
        held.update(rng.sample(group, k))
    return held


def _one_hop_rows(ent: dict[str, dict[str, Any]], subjects: list[str], pid: dict[str, str], templates: dict):
    """(subject, question row) for every relation of every subject."""
    rows = []
    for name in subjects:
        e = ent[name]
        for rel, (q, query, sent) in templates[e["type"]].items():
            rows.append((name, {
                "question": q.format(s=name), "golden_answers": _aliases(e[rel], VALUE_TYPE.get(rel, "")),
                "hops": 1, "gold_passage_ids": [pid[name]], "intermediate": "", "subject": name,
                "relation": rel, "facts": [sent.format(s=name, a=e[rel])], "queries": [query.format(s=name)],
            }))
    return rows


def _two_hop_rows(ent: dict[str, dict[str, Any]], people: list[str], companies: list[str], pid: dict[str, str],
                  corpus: list[dict[str, str]], templates: dict):
    """(subject, bridge entity, question row) for every 2-hop chain that does not leak its answer."""
    rows = []
    for stype, bridge, rel2, qtpl in TWO_HOP:
        for name in (people if stype == "person" else companies):
            mid = ent[name][bridge]
            mtype = ent[mid]["type"]
            answer = ent[mid][rel2]
            question = qtpl.format(s=name)
            first_passage = corpus[int(pid[name])]["contents"]
            # Skip chains that leak: answer in the question, or already in the first passage.
            if answer.lower() in question.lower() or answer.lower() in first_passage.lower():
                continue
            rows.append((name, mid, {
                "question": question, "golden_answers": _aliases(answer, VALUE_TYPE.get(rel2, "")),
                "hops": 2, "gold_passage_ids": [pid[name], pid[mid]], "intermediate": mid, "subject": name,
                "relation": f"{bridge}/{rel2}",
                "facts": [templates[stype][bridge][2].format(s=name, a=mid),
                          templates[mtype][rel2][2].format(s=mid, a=answer)],
                "queries": [templates[stype][bridge][1].format(s=name), templates[mtype][rel2][1].format(s=mid)],
            }))
    return rows


def _row_facts(row: dict[str, Any]) -> list[tuple[str, str]]:
    """The (entity, relation) facts a question reads."""
    ents = [row["subject"]] + ([row["intermediate"]] if row["hops"] == 2 else [])
    return list(zip(ents, row["relation"].split("/")))


def _split_by_fact(rows: list, seed: int, fraction: float) -> list:
    """heldout_by="fact": a question is held out when it reads a held-out fact. A separate stream,
    so the world itself (entities, corpus, questions) is the same whichever split is asked for."""
    every = sorted({f for _, row in rows for f in _row_facts(row)})
    held = set(random.Random(seed * 7919 + 1).sample(every, round(fraction * len(every))))
    return [(any(f in held for f in _row_facts(row)), row) for _, row in rows]


def _split_by_question(rows: list, seed: int, fraction: float) -> list:
    """heldout_by="question": `fraction` of the questions, drawn from their own stream."""
    held_idx = set(random.Random(seed * 7919 + 2).sample(range(len(rows)), round(fraction * len(rows))))
    return [(i in held_idx, row) for i, (_, row) in enumerate(rows)]


WORLD_FILES = ("corpus.jsonl", "train.jsonl", "heldout.jsonl", "entities.json")


def save_world(world: World, out_dir: str) -> dict[str, str]:
    """Write corpus.jsonl, train.jsonl, heldout.jsonl and entities.json; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {f.split(".")[0]: os.path.join(out_dir, f) for f in WORLD_FILES}
    write_jsonl(paths["corpus"], world.corpus)
    write_jsonl(paths["train"], world.train)
    write_jsonl(paths["heldout"], world.heldout)
    with open(paths["entities"], "w", encoding="utf-8") as f:
        json.dump({"seed": world.seed, "entities": world.entities}, f, indent=1, sort_keys=True)
    return paths


def load_world(world_dir: str) -> World:
    """Read a world written by `save_world`."""
    missing = [f for f in WORLD_FILES if not os.path.isfile(os.path.join(world_dir, f))]
    if missing:
        raise FileNotFoundError(
            f"{world_dir}: missing {missing}; a synthetic world directory holds {list(WORLD_FILES)} "
            "(write one with memsearcher_jax.data.synthetic.save_world)")
    with open(os.path.join(world_dir, "entities.json"), encoding="utf-8") as f:
        meta = json.load(f)
    return World(seed=meta["seed"], entities=meta["entities"],
                 corpus=read_jsonl(os.path.join(world_dir, "corpus.jsonl")),
                 train=read_jsonl(os.path.join(world_dir, "train.jsonl")),
                 heldout=read_jsonl(os.path.join(world_dir, "heldout.jsonl")))


# ----------------------------------------------------------------------------- multi-objective questions

OBJECTIVE_SEPARATOR = "; "


def check_objectives(n) -> int:
    """`world.objectives` as an int >= 1, else a ValueError naming the key and the fix."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"world.objectives must be an integer >= 1 (questions asked at once; 1: one question "
                         f"as usual), got {n!r}")
    return n


def parse_objectives_schedule(spec) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """`world.objectives_schedule` ("0:1,2;20:2,4;40:4,8": from step 0 the counts 1 and 2 in equal
    shares, from step 20 the counts 2 and 4, ...) as ((first step, counts), ...); "" gives ().
    ValueError naming the key for anything else: stages "STEP:COUNTS" joined by ";", the first at
    step 0, the steps increasing, each count an integer >= 1."""
    spec = str(spec).strip()
    if not spec:
        return ()
    stages = []
    try:
        for part in spec.split(";"):
            step, counts = part.split(":")
            stages.append((int(step), tuple(int(n) for n in counts.split(","))))
    except ValueError:
        stages = []
    steps = [s for s, _ in stages]
    if (not stages or steps[0] != 0 or any(b <= a for a, b in zip(steps, steps[1:]))
            or min(min(c) for _, c in stages) < 1):
        raise ValueError(f"world.objectives_schedule={spec!r}: expected stages STEP:COUNTS joined by ';', the first "
                         "at step 0 and the steps increasing, each COUNTS comma-separated integers >= 1, e.g. "
                         "'0:1,2;20:2,4;40:4,8' ('': off)")
    return tuple(stages)


def objectives_of(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The single questions a row asks, in answer order: its `objectives`, or the row itself."""
    return list(row["objectives"]) if "objectives" in row else [row]


def mix_objectives(rows: list[dict[str, Any]], counts: tuple[int, ...], seed: int = 0) -> list[dict[str, Any]]:
    """Questions at several objective counts in equal shares: `join_objectives` at each count,
    interleaved (row i at every count, then row i + 1), so that any prefix keeps the shares; one
    count gives `join_objectives` itself."""
    sets = [join_objectives(rows, n, seed=seed) for n in counts]
    return sets[0] if len(sets) == 1 else [s[i] for i in range(len(rows)) for s in sets]


def join_objectives(rows: list[dict[str, Any]], n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Multi-objective questions of N distinct rows each (MEM1's task); n=1 gives `rows` as they are.

    One question per row: question i asks row i and N-1 other rows drawn at random, in a random
    order, so every row is asked once as an anchor and the set size does not shrink with N. The
    question text is the N questions joined by "; "; golden_answers holds one alias list per
    objective, in that order (qa_metrics scores the answer's ";"-separated parts against them);
    objectives holds the N rows. Deterministic in (rows, n, seed).
    """
    check_objectives(n)
    if n == 1:
        return list(rows)
    if len(rows) < n:
        raise ValueError(f"world.objectives={n}: a question joins {n} distinct questions but the split has only "
                         f"{len(rows)}; lower world.objectives or grow world.num_entities")
    rng = random.Random(seed * 104_729 + n)
    out = []
    for i, anchor in enumerate(rows):
        others = rng.sample(range(len(rows) - 1), n - 1)  # indices into rows without i
        picked = [anchor] + [rows[j + (j >= i)] for j in others]
        rng.shuffle(picked)
        out.append({"id": f"{anchor['id']}-x{n}",
                    "question": OBJECTIVE_SEPARATOR.join(r["question"] for r in picked),
                    "golden_answers": [list(r["golden_answers"]) for r in picked],
                    "objectives": picked})
    return out
