"""sft.name_swap_rate: a demonstration's entity names swapped, consistently, for names no question asks about."""
import json
import random

import pytest

from memsearcher_jax.agent.rollout import Conversation
from memsearcher_jax.bases import DEFAULT_BASE
from memsearcher_jax.data.demos import DemoConfig, make_demonstrations
from memsearcher_jax.data.name_swap import NameTable, name_swapped_conversations, swap_names
from memsearcher_jax.data.synthetic import objectives_of
from memsearcher_jax.data.vocab import ReadingVocab
from memsearcher_jax.data.world_cache import prepare_world
from retrieval.bm25 import BM25Retriever

NAMES = {"person": {"pretrain": ["Pa", "Pb"], "reserved": ["Pc", "Pd", "Pe", "Pf"]},
         "city": {"pretrain": [], "reserved": ["Ca", "Cb", "Cc"]}}
IDS = {n: 100 + i for i, n in enumerate(["Pa", "Pb", "Pc", "Pd", "Pe", "Pf", "Ca", "Cb", "Cc"])}


class _Demo:
    def __init__(self, conversations):
        self.conversations = conversations


def test_the_table_knows_the_world_and_offers_only_names_outside_it():
    table = NameTable.build(NAMES, IDS, world_names=["Pc", "Pd", "Ca"])  # Pd: say, a held-out person
    assert table.world == {IDS["Pc"]: "person", IDS["Pd"]: "person", IDS["Ca"]: "city"}
    assert table.free == {"person": [IDS["Pe"], IDS["Pf"]], "city": [IDS["Cb"], IDS["Cc"]]}


def test_one_mapping_per_demonstration_by_type_and_nothing_else_moves():
    table = NameTable.build(NAMES, IDS, world_names=["Pc", "Pd", "Ca"])
    pc, pd, ca = IDS["Pc"], IDS["Pd"], IDS["Ca"]
    convs = [Conversation(prompt_ids=[1, pc, 2, ca], response_ids=[3, pc, pd, 4], loss_mask=[1, 1, 0, 1]),
             Conversation(prompt_ids=[pd, 5, pc], response_ids=[ca, 6], loss_mask=[1, 1])]
    for seed in range(20):
        out = swap_names(convs, table, random.Random(seed))
        m = {pc: out[0].prompt_ids[1], ca: out[0].prompt_ids[3], pd: out[0].response_ids[2]}
        assert m[pc] != m[pd] and {m[pc], m[pd]} <= set(table.free["person"]) and m[ca] in table.free["city"]
        assert out[0].prompt_ids == [1, m[pc], 2, m[ca]] and out[0].response_ids == [3, m[pc], m[pd], 4]
        assert out[1].prompt_ids == [m[pd], 5, m[pc]] and out[1].response_ids == [m[ca], 6]
        assert [c.loss_mask for c in out] == [c.loss_mask for c in convs]
    assert convs[0].prompt_ids == [1, pc, 2, ca]  # the input is left as it was


def test_too_few_free_names_is_an_error_not_a_collision():
    table = NameTable.build(NAMES, IDS, world_names=["Pa", "Pb", "Pc", "Pd", "Pe"])  # one free person left
    conv = Conversation(prompt_ids=[IDS["Pa"], IDS["Pb"]])
    with pytest.raises(ValueError, match="2 person entities but only 1 free"):
        swap_names([conv], table, random.Random(0))


def test_the_rate_is_the_share_of_demonstrations_swapped():
    table = NameTable.build(NAMES, IDS, world_names=["Pc"])
    demos = [_Demo([Conversation(prompt_ids=[7, IDS["Pc"]])]) for _ in range(400)]
    for rate, lo, hi in ((0.0, 0, 0), (0.5, 160, 240), (1.0, 400, 400)):
        out = name_swapped_conversations(demos, table, rate, seed=1)
        swapped = sum(c.prompt_ids[1] != IDS["Pc"] for c in out)
        assert lo <= swapped <= hi and all(c.prompt_ids[0] == 7 for c in out)
    assert [c.prompt_ids for c in name_swapped_conversations(demos, table, 0.5, seed=1)] == \
        [c.prompt_ids for c in name_swapped_conversations(demos, table, 0.5, seed=1)]
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        name_swapped_conversations(demos, table, 1.5, seed=1)


@pytest.fixture(scope="module")
def reading_world(tmp_path_factory):
    paths = prepare_world(str(tmp_path_factory.mktemp("world")), seed=0, num_entities=100, vocab_dir=DEFAULT_BASE)
    from memsearcher_jax.agent.prompts import PromptBuilder
    from memsearcher_jax.data.tokenizer import load_tokenizer

    rows = [json.loads(line) for line in open(paths.train)]
    corpus = [json.loads(line) for line in open(paths.corpus)]
    entities = json.load(open(f"{paths.world_dir}/entities.json"))["entities"]
    vocab = ReadingVocab.load(DEFAULT_BASE)
    builder = PromptBuilder(load_tokenizer(paths.tokenizer_dir))
    return rows, builder, BM25Retriever.from_passages(corpus), entities, vocab


def test_a_swapped_demonstration_still_agrees_with_itself(reading_world):
    """Real demonstrations on the shipped base's vocabulary: after the swap no world name is left,
    and the name the question asks about is the one the first query searches and the memory holds."""
    rows, builder, retriever, entities, vocab = reading_world
    table = NameTable.build(vocab.names, vocab.ids, entities)
    clean = DemoConfig(vague_query_rate=0, wrong_answer_rate=0, early_answer_rate=0)
    demos = make_demonstrations(rows[:30], builder, retriever, seed=0, config=clean)
    swapped = name_swapped_conversations(demos, table, 1.0, seed=0)
    assert len(swapped) == sum(len(d.conversations) for d in demos)
    world_ids = set(table.world)
    assert all(not world_ids & {*c.prompt_ids, *c.response_ids} for c in swapped)
    k = 0
    for d in demos:
        subject = objectives_of(d.row)[0]["question"]
        convs, k = swapped[k:k + len(d.conversations)], k + len(d.conversations)
        asked = [t for t in builder.encode(subject) if t in world_ids]
        assert len(asked) == 1, subject  # every question of the world names one entity
        new = {t for t in convs[0].prompt_ids if t in set(table.free["person"] + table.free["city"]
                                                                + table.free["company"] + table.free["country"])}
        assert len(new) == 1, builder.decode(convs[0].prompt_ids)  # the question's name, swapped
        (name,) = new
        assert name in convs[0].response_ids  # the first search asks for it
        assert name in convs[-1].prompt_ids  # and it is still there when the agent answers
