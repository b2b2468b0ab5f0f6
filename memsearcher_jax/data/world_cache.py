"""Generate the synthetic world and its tokenizer once, cache them on disk, reuse them after.

    paths = prepare_world("~/.cache/memsearcher_jax", seed=0, extra_texts=[system_prompt, ...])
    paths.corpus, paths.train, paths.heldout, paths.tokenizer_dir

The cache entry is keyed by every argument that changes its content (seed, sizes, vocab size,
the extra tokenizer texts) and by the world's wording (`synthetic.wording_fingerprint`: templates,
sentence order, value lists), so different settings or an edited template never share an entry.
It is written to a temporary directory and renamed into place, so a crash or a concurrent writer never leaves a
half-written entry: a directory under its final name is always complete.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence

from tokenizers import Tokenizer

from memsearcher_jax.data.synthetic import generate_world, save_world, wording_fingerprint
from memsearcher_jax.data.tokenizer import train_tokenizer
from memsearcher_jax.data.vocab import MANIFEST, ReadingVocab, vocab_fingerprint

CACHE_FORMAT = 2  # bump when generator or tokenizer code changes its output for the same arguments and wording

# Agent-format text the tokenizer should always compress well, whatever prompts the caller passes.
FORMAT_TEXTS = (
    '<think>I need to search.</think>\n<tool_call>{"name": "wikipedia_search", "arguments": '
    '{"query": "Gebin born year", "top_n": 5}}</tool_call>',
    "<tool_response>\nDoc 1 (Title: Gebin) Gebin\nGebin was born in the year 1968.\n</tool_response>",
    "<memory>Gebin was born in the year 1968.</memory>",
    "<think>The memory has the answer.</think>\nThe answer is \\boxed{1968}.",
    "<question>What year was Gebin born?</question>\n<memory></memory>",
)


@dataclasses.dataclass(frozen=True)
class WorldPaths:
    root: str  # the cache entry
    corpus: str  # corpus.jsonl ({"id", "contents"})
    train: str  # train.jsonl
    heldout: str  # heldout.jsonl
    world_dir: str  # directory for synthetic.load_world / tfds_builders.prepare_synthetic_qa
    tokenizer_dir: str  # directory for AutoTokenizer.from_pretrained
    stats: str  # stats.json


def _paths(root: str) -> WorldPaths:
    world = os.path.join(root, "world")
    return WorldPaths(root=root, corpus=os.path.join(world, "corpus.jsonl"), train=os.path.join(world, "train.jsonl"),
                      heldout=os.path.join(world, "heldout.jsonl"), world_dir=world,
                      tokenizer_dir=os.path.join(root, "tokenizer"), stats=os.path.join(root, "stats.json"))


def cache_key(seed: int, num_entities: int, num_countries: int, heldout_fraction: float, vocab_size: int,
              extra_texts: Sequence[str], heldout_by: str = "entity", whole_names: bool = False,
              vocab_dir: str | None = None) -> str:
    wording = ReadingVocab.load(vocab_dir).wording if vocab_dir else "v1"
    key = [CACHE_FORMAT, wording_fingerprint(wording), seed, num_entities, num_countries, heldout_fraction, vocab_size,
           list(extra_texts)]
    if heldout_by != "entity" or whole_names:  # default keys stay what they were: existing caches still hit
        key += [heldout_by, whole_names]
    if vocab_dir:
        key += ["reading-vocab", vocab_fingerprint(vocab_dir)]
    h = hashlib.sha256(json.dumps(key).encode())
    return f"world-s{seed}-n{num_entities}-v{vocab_size}-{h.hexdigest()[:12]}"


def _build(tmp: str, seed: int, num_entities: int, num_countries: int, heldout_fraction: float, vocab_size: int,
           extra_texts: Sequence[str], heldout_by: str = "entity", whole_names: bool = False,
           vocab_dir: str | None = None) -> None:
    paths = _paths(tmp)
    vocab = ReadingVocab.load(vocab_dir) if vocab_dir else None
    world = generate_world(seed, num_entities=num_entities, num_countries=num_countries,
                           heldout_fraction=heldout_fraction, heldout_by=heldout_by,
                           names=vocab.pool("reserved") if vocab else None, wording=vocab.wording if vocab else "v1")
    save_world(world, paths.world_dir)
    if vocab_dir:  # the reading vocabulary's tokenizer, as it is: names and values are whole tokens
        os.makedirs(paths.tokenizer_dir)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", MANIFEST):
            shutil.copy2(os.path.join(vocab_dir, name), paths.tokenizer_dir)
    else:
        train_tokenizer(world.texts(), paths.tokenizer_dir, vocab_size=vocab_size,
                        extra_texts=list(FORMAT_TEXTS) + list(extra_texts),
                        word_pieces=None if whole_names else world.name_pieces())
    tok = Tokenizer.from_file(os.path.join(paths.tokenizer_dir, "tokenizer.json"))

    def mean_len(texts: list[str]) -> float:
        return round(sum(len(e.ids) for e in tok.encode_batch(texts)) / max(1, len(texts)), 2)

    stats = {
        "seed": seed, "entities": sum(1 for e in world.entities.values() if e["type"] != "country"),
        "countries": num_countries, "passages": len(world.corpus),
        "train_questions": len(world.train), "heldout_questions": len(world.heldout),
        "train_2hop": sum(r["hops"] == 2 for r in world.train),
        "heldout_2hop": sum(r["hops"] == 2 for r in world.heldout),
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "mean_passage_tokens": mean_len([p["contents"] for p in world.corpus]),
        "mean_question_tokens": mean_len([r["question"] for r in world.train + world.heldout]),
    }
    with open(paths.stats, "w") as f:
        json.dump(stats, f, indent=1)


def prepare_world(cache_dir: str, seed: int = 0, num_entities: int = 100, num_countries: int = 6,
                  heldout_fraction: float = 0.15, vocab_size: int = 1024,
                  extra_texts: Sequence[str] = (), heldout_by: str = "entity",
                  whole_names: bool = False, vocab_dir: str | None = None) -> WorldPaths:
    """Return the cached world + tokenizer for these arguments, building them on first use.

    vocab_dir: a reading vocabulary (a directory with reading_vocab.json, e.g. the shipped base
    model): the world's entities take names from its reserved pool, which the base never saw
    in pretraining, and its tokenizer is the world's (no tokenizer is trained)."""
    cache_dir = os.path.expanduser(cache_dir)
    os.makedirs(cache_dir, exist_ok=True)
    final = os.path.join(cache_dir, cache_key(seed, num_entities, num_countries, heldout_fraction, vocab_size,
                                              extra_texts, heldout_by, whole_names, vocab_dir))
    if not os.path.isdir(final):
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=cache_dir)  # same filesystem, so rename is atomic
        try:
            _build(tmp, seed, num_entities, num_countries, heldout_fraction, vocab_size, extra_texts, heldout_by,
                   whole_names, vocab_dir)
            try:
                os.rename(tmp, final)
            except OSError:
                if not os.path.isdir(final):  # not a lost race with another writer: a real error
                    raise
        finally:
            if os.path.isdir(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
    paths = _paths(final)
    for p in (paths.corpus, paths.train, paths.heldout, os.path.join(paths.tokenizer_dir, "tokenizer.json")):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{final}: cache entry lacks {p}; delete the entry to rebuild it")
    return paths
