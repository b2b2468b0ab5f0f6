"""The reading vocabulary: a fixed tokenizer in which every name and every value is one token.

A tiny model learns to copy far faster when what it copies is one token (see
docs/lab/2026-11-23-a-reading-base-pretrained.md): a 3-token key stayed at chance for 3000 steps, a
1-token key started to learn after ~400. So the base model's tokenizer is built once, from a
seed, with
- a small byte-level BPE over the templates and prompts (Qwen's pre-tokenizer and chat markup,
  so the agent code treats it like a real checkpoint's tokenizer);
- one added token per made-up entity name, in pools per type (person, city, company,
  country), each pool split in two: **pretrain** names, which the base's pretraining may use,
  and **reserved** names, which it never sees. Worlds for SFT, GRPO and evaluation draw their
  entities from the reserved pools, so held-out questions ask about names the base never read;
- one added token per attribute value (years, occupations, colours, products, landmarks).

An added token is matched before pre-tokenization, so a name is the same id wherever it
stands ("Gebin", " Gebin", `"Gebin`, `{Gebin}`); a preceding space becomes its own token.

    vocab = build_vocab(out_dir)            # writes tokenizer files + reading_vocab.json
    vocab = ReadingVocab.load(out_dir)      # names, values, their ids
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random

from tokenizers import AddedToken, Tokenizer

from memsearcher_jax.agent.prompts import (
    COMPACT_SYSTEM_PROMPT,
    COMPACT_UPDATE_INSTRUCTION,
    MEMORY_UPDATE_INSTRUCTION,
    memsearcher_system_prompt,
    react_system_prompt,
)
from memsearcher_jax.data.synthetic import (
    COLOURS,
    LANDMARKS,
    OCCUPATIONS,
    PRODUCTS,
    YEARS,
    make_name,
    template_texts,
    template_words,
)
from memsearcher_jax.data.tokenizer import AGENT_TAGS, build_untrained, save_tokenizer

MANIFEST = "reading_vocab.json"
NAME_TYPES = ("person", "city", "company", "country")
# (pretrain, reserved) names per type. Reserved pools bound the size of an evaluation world:
# a 100-entity world takes 60 people, 15 cities, 25 companies and 6 countries.
POOL_SIZES = {"person": (1200, 400), "city": (300, 120), "company": (400, 160), "country": (80, 40)}
VALUE_KINDS = {"year": YEARS, "occupation": OCCUPATIONS, "colour": COLOURS, "product": PRODUCTS,
               "landmark": LANDMARKS}
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ReadingVocab:
    """Names (per type and pool) and values (per kind) of a reading tokenizer, with their ids."""

    tokenizer_dir: str
    names: dict[str, dict[str, list[str]]]   # type -> {"pretrain": [...], "reserved": [...]}
    values: dict[str, list[str]]             # kind -> [...]
    ids: dict[str, int]                      # every name and value -> its token id
    wording: str = "v1"                      # the world's wording it was built for (synthetic.WORDINGS)

    def pool(self, kind: str) -> dict[str, list[str]]:
        """Names per type from one pool ("pretrain" or "reserved")."""
        if kind not in ("pretrain", "reserved"):
            raise ValueError(f"pool must be 'pretrain' or 'reserved', got {kind!r}")
        return {t: list(p[kind]) for t, p in self.names.items()}

    @classmethod
    def load(cls, directory: str) -> ReadingVocab:
        path = os.path.join(directory, MANIFEST)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{directory}: no {MANIFEST}; a reading vocabulary directory is written by "
                                    "memsearcher_jax.data.vocab.build_vocab")
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
        if m.get("format") != FORMAT_VERSION:
            raise ValueError(f"{path}: format {m.get('format')!r}, this version reads {FORMAT_VERSION}")
        return cls(tokenizer_dir=directory, names=m["names"], values=m["values"], ids=m["ids"],
                   wording=m.get("wording", "v1"))

    @staticmethod
    def exists(directory: str) -> bool:
        return os.path.isfile(os.path.join(directory, MANIFEST))


def _name_pools(seed: int, wording: str = "v1") -> dict[str, dict[str, list[str]]]:
    rng = random.Random(seed)
    taken = template_words(wording)
    made: list[str] = []
    pools = {}
    for kind in NAME_TYPES:
        n_pre, n_res = POOL_SIZES[kind]
        names = []
        while len(names) < n_pre + n_res:
            name = make_name(rng, kind, taken)
            low = name.lower()
            # No name may be a prefix of another: an added token could otherwise match inside one.
            if any(low.startswith(m) or m.startswith(low) for m in made):
                continue
            made.append(low)
            names.append(name)
        pools[kind] = {"pretrain": names[:n_pre], "reserved": names[n_pre:]}
    return pools


# The agent's own text with its names and values left out (they are whole tokens anyway).
FORMAT_LINES = (
    '<think>I need to search.</think>\n<tool_call>{"name": "wikipedia_search", "arguments": '
    '{"query": " born year", "top_n": 2}}</tool_call>',
    "<tool_response>\nDoc 1 (Title: ) \nDoc 2 (Title: ) \nDoc 3 (Title: ) \n</tool_response>",
    "<think>The memory has the answer.</think>\n\\boxed{}",
    "<think>Next search .</think>\n<think>Not found. Search again.</think>\n<think>I know the answer.</think>",
    "<question> </question>\n<memory> </memory>\nNothing found about  yet.",
    "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n",
)


def _merge_texts(wording: str = "v1") -> list[str]:
    prompts = [memsearcher_system_prompt(n) + react_system_prompt(n) for n in (2, 3, 5)]
    prompts += [COMPACT_SYSTEM_PROMPT, COMPACT_UPDATE_INSTRUCTION, MEMORY_UPDATE_INSTRUCTION]
    # Templates and format lines weigh more than the long system prompts: they are most of the text.
    return template_texts(wording) * 20 + list(FORMAT_LINES) * 20 + prompts


def build_vocab(out_dir: str, seed: int = 0, bpe_size: int = 640, wording: str = "v1") -> ReadingVocab:
    """Build the reading tokenizer deterministically from `seed` and write it to out_dir.

    bpe_size: entries of the BPE part (bytes, special tokens, merges); names, values and agent
    tags come on top as added tokens.
    wording: the world's wording (synthetic.WORDINGS) whose templates the merges are learnt on; it
    is recorded, and every world built for this vocabulary is written in it.
    """
    names = _name_pools(seed, wording)
    tok, trainer = build_untrained(bpe_size + len(AGENT_TAGS))
    # Merges are learnt on the templates and prompts, with names and values left out (they are
    # whole tokens anyway): the BPE budget goes to the words around them.
    tok.train_from_iterator(_merge_texts(wording), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in AGENT_TAGS])
    words = [n for kind in NAME_TYPES for pool in ("pretrain", "reserved") for n in names[kind][pool]]
    words += [v for vs in VALUE_KINDS.values() for v in vs]
    tok.add_tokens([AddedToken(w, special=False, normalized=False, single_word=True) for w in words])
    save_tokenizer(tok, out_dir)
    raw = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    ids = {w: raw.token_to_id(w) for w in words}
    missing = [w for w, i in ids.items() if i is None]
    if missing:
        raise RuntimeError(f"build_vocab: {len(missing)} words did not become tokens, e.g. {missing[:5]}")
    manifest = {"format": FORMAT_VERSION, "seed": seed, "bpe_size": bpe_size, "names": names,
                "values": {k: list(v) for k, v in VALUE_KINDS.items()}, "ids": ids}
    if wording != "v1":  # a v1 manifest stays byte for byte what it was (its fingerprint keys world caches)
        manifest["wording"] = wording
    with open(os.path.join(out_dir, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=0)
    return ReadingVocab.load(out_dir)


def vocab_fingerprint(directory: str) -> str:
    """A short hash of the tokenizer and manifest (for cache keys)."""
    h = hashlib.sha256()
    for name in ("tokenizer.json", MANIFEST):
        with open(os.path.join(directory, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:12]


def name_groups(vocab: ReadingVocab) -> list[list[int]]:
    """Token ids of every name, one group per type (pretrain and reserved pools together)."""
    return [[vocab.ids[n] for pool in ("pretrain", "reserved") for n in vocab.names[kind][pool]]
            for kind in NAME_TYPES]


def value_groups(vocab: ReadingVocab) -> list[list[int]]:
    """Token ids of the attribute values, one group per kind (years, occupations, ...)."""
    return [[vocab.ids[v] for v in values] for values in vocab.values.values()]


def tied_row_groups(directory: str) -> list[list[int]]:
    """The reading vocabulary's (in `directory`) name rows, a group per type, and value rows, a
    group per kind: the embedding rows SFT moves together, as pretraining did."""
    vocab = ReadingVocab.load(directory)
    return name_groups(vocab) + value_groups(vocab)
