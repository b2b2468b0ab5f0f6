"""The CLI jobs around training: export-hf from a checkpoint, eval from a checkpoint or a
Hugging Face directory, and their errors."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from memsearcher_jax.cli import main
from tests.test_train_step import ROOT, SMALL


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 1-step training run of the tiny default (no warm start, no held-out eval)."""
    d = tmp_path_factory.mktemp("jobs")
    out, worlds = str(d / "run"), str(d / "worlds")
    args = ["train", "--config", os.path.join(ROOT, "configs/default.py")]
    args += [f"--config.{k}={v}" for k, v in SMALL + [("world.cache_dir", worlds), ("train.output_dir", out),
                                                     ("train.steps", "1"), ("train.save_every", "1")]]
    assert main(args) == 0
    return d, out, worlds


def _eval_args(worlds, *extra):
    return ["eval", "--config", os.path.join(ROOT, "configs/default.py"), f"--config.world.cache_dir={worlds}",
            "--config.model.source=init", "--config.model.hidden_size=64", "--config.model.intermediate_size=128",
            "--config.model.num_layers=2",
            "--config.model.head_dim=16", "--limit", "6", *extra]


@pytest.mark.slow
def test_export_then_eval_from_hf_dir_equals_eval_from_checkpoint(trained, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM

    from memsearcher_jax.app import experiment
    from memsearcher_jax.app.jobs import restore_policy
    from memsearcher_jax.models import from_pretrained, param_dict
    from memsearcher_jax.rules import config_rules

    d, out, worlds = trained

    def refuse(*args, **kwargs):
        raise AssertionError("eval needs only a sampler: no learner, no training-memory check")

    monkeypatch.setattr(experiment, "GRPOLearner", refuse)
    monkeypatch.setattr(config_rules, "check_fits", refuse)  # every caller asks it through config_rules
    hf_dir = str(d / "hf")
    assert main(["export-hf", "--checkpoint", out, "--out", hf_dir]) == 0
    assert os.path.isfile(os.path.join(hf_dir, "tokenizer.json"))  # the world's tokenizer went along
    AutoModelForCausalLM.from_pretrained(hf_dir)  # transformers takes it as it is
    ckpt_model, meta = restore_policy(out)
    assert meta["step"] == 1
    exported = param_dict(from_pretrained(hf_dir))
    for k, v in param_dict(ckpt_model).items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(exported[k]), err_msg=k)

    results = {}
    for name, source in (("ckpt", ["--checkpoint", out]), ("hf", ["--model", hf_dir])):
        eval_out = str(d / f"eval_{name}")
        assert main(_eval_args(worlds, *source, "--out", eval_out)) == 0
        table = capsys.readouterr().out
        assert "synthetic-heldout" in table and "mean prompt tokens" in table
        with open(os.path.join(eval_out, "results.json")) as f:
            results[name] = json.load(f)
        with open(os.path.join(eval_out, "trajectories.jsonl")) as f:
            trajs = [json.loads(line) for line in f]
        assert len(trajs) == 6 and all({"question", "golds", "em", "context_tokens", "conversations"} <= set(t)
                                       for t in trajs)
    # Greedy evaluation of the same weights: the same table either way.
    assert results["ckpt"] == results["hf"]


def test_eval_needs_exactly_one_model_source(tmp_path, capsys):
    worlds = str(tmp_path / "worlds")
    assert main(_eval_args(worlds)) == 2
    assert "exactly one of --checkpoint or --model" in capsys.readouterr().err
    assert main(_eval_args(worlds, "--model", str(tmp_path))) == 2
    assert "not a Hugging Face model directory" in capsys.readouterr().err


def test_export_from_a_missing_checkpoint_names_it(tmp_path, capsys):
    assert main(["export-hf", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    assert "no checkpoint directory" in capsys.readouterr().err and not os.path.exists(tmp_path / "out")


def _recording_warm_start(tmp_path, monkeypatch, overrides=(), **sft):
    """The default config (the shipped reading base unless `overrides` say otherwise) with `sft`
    set, its set-up, and sft_train replaced by a recorder of each call's (conversations, tied rows)."""
    from memsearcher_jax.app import warm_start as ws
    from memsearcher_jax.app.experiment import build_setup
    from memsearcher_jax.settings.config_utils import load_config

    cfg = load_config(os.path.join(ROOT, "configs/default.py"), [*overrides, ("world.cache_dir", str(tmp_path / "w"))])
    cfg.sft.update(steps=1, **sft)
    setup = build_setup(cfg)
    calls = []
    monkeypatch.setattr(ws, "sft_train", lambda model, convs, config, pad_id, tied_rows=None:
                        (calls.append((convs, tied_rows)) or model, [{"loss": 0.0}]))
    return cfg, setup, calls


def test_warm_start_builds_demos_from_the_sft_config(tmp_path, monkeypatch):
    """sft.* flaw rates and react_share reach the demonstrations the warm start trains on."""
    from memsearcher_jax.app import warm_start as ws

    cfg, setup, calls = _recording_warm_start(
        tmp_path, monkeypatch, SMALL, num_demos=30, react_share=1.0, two_hop_early_rate=1.0, vague_query_rate=0.0,
        wrong_answer_rate=0.0, early_answer_rate=0.0, early_two_hop="first_hop")
    out = ws.warm_start(cfg, setup, str(tmp_path / "ws"))
    assert os.path.isfile(os.path.join(out, "config.json"))
    rows = setup.train_questions[:30]
    seen = calls[0][0]
    assert len(calls) == 1 and len(seen) == len(rows)  # ReAct: one growing conversation per demo
    b = setup.builder
    for conv, row in zip(seen, rows):
        assert conv.prompt_ids == b.react_context(row["question"])
        text = b.decode(conv.response_ids)
        assert text.count("<tool_call>") == 1  # 2-hop demos stop after hop 1; 1-hop demos search once
        if row["hops"] == 2:
            assert "\\boxed{" + row["intermediate"] + "}" in text
    # sft.early_two_hop reaches them too: "no_search" 2-hop demos guess before any search.
    cfg.sft.early_two_hop = "no_search"
    ws.warm_start(cfg, setup, str(tmp_path / "ws2"))
    seen = calls[1][0]
    two_hop = [(conv, row) for conv, row in zip(seen, rows) if row["hops"] == 2]
    assert two_hop and all("<tool_call>" not in b.decode(conv.response_ids) for conv, _ in two_hop)


def test_warm_start_ties_name_and_value_rows_only_when_asked(tmp_path, monkeypatch):
    """sft.tie_embedding_rows: the warm start gets the reading vocabulary's name groups (a type's
    names, training and held-out entities alike) and value groups; off, it gets none; "auto" (the
    default) ties on a reading base and not on a model without a reading vocabulary, where True is
    refused with the key's name before any training; any other value is refused."""
    from memsearcher_jax.app import warm_start as ws
    from memsearcher_jax.app.experiment import build_setup
    from memsearcher_jax.data.vocab import ReadingVocab, name_groups, value_groups
    from memsearcher_jax.errors import UserInputError
    from memsearcher_jax.settings.config_utils import load_config

    cfg, setup, calls = _recording_warm_start(tmp_path, monkeypatch, num_demos=10)
    assert cfg.sft.tie_embedding_rows == "auto"  # the default
    ws.warm_start(cfg, setup, str(tmp_path / "auto"))
    cfg.sft.tie_embedding_rows = "False"  # as --config.sft.tie_embedding_rows=False gives it
    ws.warm_start(cfg, setup, str(tmp_path / "off"))
    cfg.sft.tie_embedding_rows = "True"
    ws.warm_start(cfg, setup, str(tmp_path / "on"))
    got = [tied for _, tied in calls]
    assert got[1] is None
    vocab = ReadingVocab.load(setup.tokenizer_dir)
    assert got[0] == got[2]
    groups = got[2]
    assert groups == name_groups(vocab) + value_groups(vocab)
    group_of = {i: g for g, ids in enumerate(groups) for i in ids}
    people = set(vocab.names["person"]["reserved"])
    train_person = next(r["subject"] for r in setup.train_questions if r["subject"] in people)
    held_person = next(r["subject"] for r in setup.eval_questions if r["subject"] in people)
    assert train_person != held_person
    assert group_of[vocab.ids[train_person]] == group_of[vocab.ids[held_person]]

    plain = load_config(os.path.join(ROOT, "configs/default.py"), SMALL + [("world.cache_dir", str(tmp_path / "w2"))])
    plain_setup = build_setup(plain)
    assert ws.embedding_row_groups(plain, plain_setup) is None  # auto: nothing to tie on this model
    plain.sft.tie_embedding_rows = "True"
    with pytest.raises(UserInputError, match="sft.tie_embedding_rows"):
        ws.warm_start(plain, plain_setup, str(tmp_path / "plain"))
    assert not os.path.exists(tmp_path / "plain")
    plain.sft.tie_embedding_rows = "sometimes"
    with pytest.raises(UserInputError, match="sft.tie_embedding_rows='sometimes'"):
        ws.embedding_row_groups(plain, plain_setup)



def test_warm_start_swaps_names_only_when_asked_and_never_for_a_held_out_one(tmp_path, monkeypatch):
    """sft.name_swap_rate: 0 (the default) trains on the demonstrations as scripted; 1 on the same
    rows with every world name (training and held-out) replaced by a reserved name the world does
    not use; a model without a reading vocabulary is refused by name (a rate outside [0, 1]:
    test_validation.py, up front). A warm start builds its name table once."""
    from memsearcher_jax.app import warm_start as ws
    from memsearcher_jax.app.experiment import build_setup
    from memsearcher_jax.data.name_swap import NameTable
    from memsearcher_jax.data.vocab import ReadingVocab
    from memsearcher_jax.errors import UserInputError
    from memsearcher_jax.settings.config_utils import load_config

    cfg, setup, calls = _recording_warm_start(tmp_path, monkeypatch, num_demos=12)
    assert cfg.sft.name_swap_rate == 0.0  # the default
    demos = ws.flawed_demonstrations(cfg, setup)
    ws.warm_start(cfg, setup, str(tmp_path / "plain"), ws.warm_start_inputs(cfg, setup, demos))
    cfg.sft.name_swap_rate = 1.0
    builds, build = [], NameTable.build
    monkeypatch.setattr(NameTable, "build", classmethod(lambda cls, *a: builds.append(a) or build(*a)))
    # as train_job runs it: the checks and inputs first, then the warm start on them
    checked = ws.prepare_warm_start(cfg, setup, str(tmp_path / "run"), fresh=True)
    ws.warm_start(cfg, setup, str(tmp_path / "swapped"), checked)
    assert len(builds) == 1  # it was built twice: once to check the rate, once for the rows
    (plain, _), (swapped, _) = calls
    assert [c.loss_mask for c in plain] == [c.loss_mask for c in swapped]
    vocab = ReadingVocab.load(setup.tokenizer_dir)
    world = {vocab.ids[r["subject"]] for r in setup.train_questions + setup.eval_questions if r["subject"] in vocab.ids}
    assert world and any(world & set(c.prompt_ids) for c in plain)
    assert not any(world & {*c.prompt_ids, *c.response_ids} for c in swapped)

    plain_cfg = load_config(os.path.join(ROOT, "configs/default.py"),
                            SMALL + [("world.cache_dir", str(tmp_path / "w2"))])
    plain_cfg.sft.update(steps=1, name_swap_rate=0.5)
    with pytest.raises(UserInputError, match="sft.name_swap_rate=0.5.*reading_vocab.json"):
        ws.prepare_warm_start(plain_cfg, build_setup(plain_cfg), str(tmp_path / "p"), fresh=True)
