"""The next reading base (not run yet: it needs an accelerator's ~11 minutes, a day on a 2-core CPU):
reading_v3's recipe (configs/base_v3.py) with layer-1 positional heads that start at every distance
a one-hop fact puts between its subject and its value.

    memsearcher-jax pretrain --config configs/base_v4.py --config.train.output_dir=runs/base_v4

Why (docs/experiments.md, 2026-11-27): reading_v3 binds a value to its subject only in layer 1, by
heads that reach 6-8 tokens back, where base_v3's init started them (offsets 5-8). The works_for
value sits 4 tokens after its subject ("Gebin works for Mekatek": name, " works", " for", " ",
value), so no head binds it and it reads 20% at 8 passages while every other relation reads
>= 93%. In a 500-step 4 x 128 run, a layer-1 head started at offset 4 put weight 1.00 on the works_for
subject (0.00 with base_v3's offsets). Here layer 1's eight heads start at 3, 4, 6, 7, 8 and 9 (7 and 8
twice: the most common distances); tests/test_pretrain.py checks they cover every relation's distance.

Weaker evidence since (docs/experiments.md, eighth session): a rewording that puts the works_for value
8 tokens after its subject gets the binding in reading_v3 at once (layer-1 weight 0.91, 0.98 after 100
steps of continued pretraining), yet works_for still reads ~36% at 8 passages after 200 steps. A
binding head may be needed but is not enough on its own, at least when it comes after pretraining.
And from scratch (tenth session, base_v2's 4 x 128 shape, 1200 steps of phase 1): a layer-1 head started
at offset 4 read works_for at 81% on same-type pairs against 65% without it (~23 items each), and the other relations
worse on the whole (binding over all relations 71.5% against 82.0%).

Against it (eleventh session, the same small runs, 1024 binding pairs each): layer 1 started at (3, 4, 7, 8)
bound product and colour far better (pairs 15 -> 55%, 12 -> 31%; their plain-word values sit 3 back) but
works_for no better (35 -> 39%; born_in 69%). What did bring works_for near born_in was the world's
sentence reworded to put the value 8 tokens back ("{s} works for the company called {a}.": 68% against
79%). So this config may lift colour and product and is unlikely to fix works_for; a device run of
base_v3 on the reworded world is the likelier test, at the price of changing the world.
The twelfth session replicated it on a second seed (works_for pairs 82% against born_in's 86%; the shipped
sentence 7% against 89%) and found reading_v3's works_for question ignoring its subject even over keys that
carry it, which no head on the sentence side can mend (docs/experiments.md).
"""
import base_v3  # beside this file (the config loader puts its folder on sys.path)
import ml_collections

# Layer 1's starting offsets: every one-hop relation's subject-to-value distance in the reading
# tokenizer (colour and product 3, works_for 4, occupation and known_for 6, born_year, founder and
# founded_year 7, born_in and based_in 8, country 9).
LAYER1_OFFSETS = (3, 4, 6, 7, 8, 9, 7, 8)


def get_config() -> ml_collections.ConfigDict:
    c = base_v3.get_config()
    c.model.positional_heads = ((1, 2, 3, 4), LAYER1_OFFSETS)
    c.train.output_dir = "runs/base_v4"
    return c
