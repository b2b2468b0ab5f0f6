"""A generated corpus where every query has one known gold passage (tests and benchmarks).

Each passage describes a fictional landmark by a unique combination of attributes drawn from
real-word vocabularies; its query paraphrases three of them. Other passages share single
attributes, so a retriever has to match the combination, not a keyword.
"""
from __future__ import annotations

import random

CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Hanoi", "Quebec", "Krakow", "Seville", "Dublin", "Kyoto",
          "Cairo", "Bergen", "Porto", "Tunis", "Zagreb", "Havana", "Perth", "Riga", "Accra", "Quito"]
THINGS = ["lighthouse", "library", "bridge", "observatory", "monastery", "windmill", "aqueduct", "theatre",
          "museum", "fortress", "greenhouse", "cathedral", "railway station", "market hall", "opera house"]
MATERIALS = ["red granite", "white marble", "bamboo", "cast iron", "glass", "oak timber", "limestone",
             "copper", "basalt", "terracotta", "sandstone", "steel"]
FOUNDERS = ["a shipbuilder", "a violinist", "a beekeeper", "a chess champion", "an astronomer", "a brewer",
            "a cartographer", "a glassblower", "a botanist", "a clockmaker", "a poet", "a locksmith"]
# How queries refer to founders: a paraphrase, so dense matching beats keyword overlap.
FOUNDER_PARAPHRASE = {"a shipbuilder": "someone who built ships", "a violinist": "a violin player",
                      "a beekeeper": "a keeper of bees", "a chess champion": "a chess master",
                      "an astronomer": "a stargazer", "a brewer": "a beer maker",
                      "a cartographer": "a map maker", "a glassblower": "a glass artisan",
                      "a botanist": "a plant scientist", "a clockmaker": "a maker of clocks",
                      "a poet": "a writer of verse", "a locksmith": "a lock maker"}
FEATURES = ["a rooftop garden", "a spiral staircase", "a giant pendulum", "a collection of maps",
            "a frozen fountain", "a hall of mirrors", "an orchestra of bells", "a hidden tunnel",
            "a mosaic of whales", "a solar clock", "a library of seeds", "a dragon weathervane"]


def generate(n: int, seed: int = 0) -> tuple[list[dict], list[str], list[str]]:
    """-> (passages [{"id","contents"}], queries, gold passage id per query); len == n each."""
    rng = random.Random(seed)
    seen, passages, queries, gold = set(), [], [], []
    while len(passages) < n:
        a = (rng.choice(CITIES), rng.choice(THINGS), rng.choice(MATERIALS), rng.choice(FOUNDERS),
             rng.choice(FEATURES), rng.randrange(1700, 2000))
        key = (a[0], a[1], a[2], a[3])
        if key in seen:
            continue
        seen.add(key)
        city, thing, material, founder, feature, year = a
        pid = f"doc{len(passages):06d}"
        title = f"{material.title()} {thing.title()} of {city}"
        text = (f"The {material} {thing} of {city} was founded in {year} by {founder}. "
                f"Visitors remember it for {feature}.")
        passages.append({"id": pid, "contents": f"{title}\n{text}"})
        queries.append(f"{city} {thing} made of {material}, started by {FOUNDER_PARAPHRASE[founder]}")
        gold.append(pid)
    return passages, queries, gold


def recall_at_k(results, gold: list[str], k: int) -> float:
    """Fraction of queries whose gold id is among the first k hits."""
    return sum(g in [h.id for h in hits[:k]] for hits, g in zip(results, gold)) / len(gold)
