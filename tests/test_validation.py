"""Validation (issue 56): bad input is refused with one line naming it (exit 2) before any work,
and good input is accepted.

Each test runs the CLI as a user would (`main(argv)`, in process) and asserts the exit status
and the message, or that the job ran."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from memsearcher_jax.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
RECIPE = os.path.join(ROOT, "configs", "memsearcher_qwen2_5_3b.py")


def _run(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _error_lines(output: str) -> list[str]:
    """The lines of the error message: everything after the job's last log line."""
    lines = output.strip().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("memsearcher-jax: "))
    return lines[first:]


def _write_jsonl(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


# ----------------------------------------------------------------------------- item 0: eval with the recipe

@pytest.fixture(scope="module")
def tiny_real_data(tmp_path_factory):
    """A tiny Qwen2 model directory with the Qwen tokenizer, a bamboogle set of two questions and
    a BM25 index over four passages: what `eval` with the recipe config reads."""
    from flax import nnx

    from memsearcher_jax.models import ModelConfig, Qwen2, save_pretrained
    from tests.assets import qwen_tokenizer_dir

    d = tmp_path_factory.mktemp("real")
    mc = ModelConfig(vocab_size=151_680, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                     num_kv_heads=1, head_dim=16)
    save_pretrained(Qwen2(mc, rngs=nnx.Rngs(0)), str(d / "model"), tokenizer_dir=qwen_tokenizer_dir())
    _write_jsonl(d / "data" / "bamboogle" / "test.jsonl",
                 [{"id": str(i), "question": f"Who wrote book {i}?", "golden_answers": [f"author {i}"]}
                  for i in range(2)])
    _write_jsonl(d / "corpus.jsonl", [{"id": str(i), "contents": f"Book {i}\nBook {i} was written by author {i}."}
                                      for i in range(4)])
    assert main(["index", "--corpus", str(d / "corpus.jsonl"), "--out", str(d / "idx"), "--index-type", "bm25"]) == 0
    return d


@pytest.mark.slow
def test_eval_with_the_recipe_config_does_not_ask_for_its_training_data(tiny_real_data, tmp_path, capsys,
                                                                        monkeypatch):
    """The recipe names data.train_path=data/nq_hotpotqa_train, which evaluation never reads: it
    was refused ('no such file') although every path eval reads was there."""
    d = tiny_real_data
    monkeypatch.chdir(tmp_path)  # no data/nq_hotpotqa_train here
    code, msg = _run(capsys, "eval", "--config", RECIPE, "--model", str(d / "model"), "--split", "bamboogle",
                     "--config.world.enabled=false", f"--config.data.eval_path={d / 'data'}",
                     "--config.retrieval.kind=index", f"--config.retrieval.index_dir={d / 'idx'}",
                     "--config.agent.max_new_tokens=4", "--config.agent.eval_max_turns=2", "--limit", "1")
    assert code == 0, msg
    assert "data.train_path" not in msg
    assert any(line.split()[:2] == ["bamboogle", "1"] for line in msg.splitlines()), msg
    # the paths eval does read are still checked, before any model is loaded
    code, msg = _run(capsys, "eval", "--config", RECIPE, "--model", str(d / "model"), "--split", "bamboogle",
                     "--config.world.enabled=false", f"--config.data.eval_path={tmp_path / 'nope'}",
                     "--config.retrieval.kind=index", f"--config.retrieval.index_dir={d / 'idx'}")
    assert code == 2 and f"data.eval_path={tmp_path / 'nope'}: no such file or directory" in msg, msg
    # and training still asks for its data
    code, msg = _run(capsys, "train", "--config", RECIPE, f"--config.model.source={d / 'model'}",
                     f"--config.data.eval_path={d / 'data'}", f"--config.train.output_dir={tmp_path / 'run'}",
                     "--config.retrieval.kind=index", f"--config.retrieval.index_dir={d / 'idx'}")
    assert code == 2 and "data.train_path=data/nq_hotpotqa_train: no such file" in msg, msg
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- item 6: train and eval agree

def test_train_from_a_model_without_its_reading_vocab_is_refused_as_eval_refuses_it(tmp_path, capsys):
    """Without reading_vocab.json the synthetic world builds another tokenizer and other questions
    (655/171 instead of 643/180): `eval` refused that model; `train` trained on it. Both refuse now,
    naming the file, before the output directory is made."""
    import shutil

    from memsearcher_jax.bases import DEFAULT_BASE

    model = tmp_path / "model"
    shutil.copytree(DEFAULT_BASE, model, ignore=shutil.ignore_patterns("reading_vocab.json"))
    out = tmp_path / "run"
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.model.source={model}",
                     f"--config.train.output_dir={out}", f"--config.world.cache_dir={tmp_path / 'worlds'}",
                     "--config.sft.steps=0", "--config.train.steps=0", "--config.train.eval_questions=0")
    assert code == 2 and f"model.source={model}" in msg and f"{model} has no reading_vocab.json" in msg, msg
    assert len(msg.strip().splitlines()) == 1 and not out.exists()


# ----------------------------------------------------------------------------- item 7 and the objectives traceback

def test_objectives_the_turns_or_the_context_cannot_hold_are_named_before_any_work(tmp_path, capsys):
    """world.objectives=9 with the default turns: a RuntimeError from the demonstrator (32 lines)
    after the output dir was made. world.objectives=100 with sft.steps=0: 166 s of training on
    prompts of >1024 tokens, every response 1 token, exit 0. Both are one line now, exit 2, and
    the output dir is not made."""
    from memsearcher_jax.bases import DEFAULT_BASE

    out, worlds = tmp_path / "run", f"--config.world.cache_dir={tmp_path / 'worlds'}"
    common = ("train", "--config", DEFAULT, f"--config.train.output_dir={out}", worlds,
              "--config.train.steps=0", "--config.train.eval_questions=0")
    code, msg = _run(capsys, *common, "--config.world.objectives=9")
    assert code == 2 and "agent.max_turns=4" in msg and "need up to 18 turns" in msg, msg
    assert "Traceback" not in msg and len(msg.strip().splitlines()) == 1 and not out.exists()
    code, msg = _run(capsys, *common, "--config.world.objectives=100", "--config.sft.steps=0")
    assert code == 2 and "agent.max_context_tokens=1024" in msg and "first prompt is" in msg, msg
    assert len(msg.strip().splitlines()) == 1 and not out.exists()
    code, msg = _run(capsys, "eval", "--config", DEFAULT, "--model", DEFAULT_BASE, "--objectives", "100", worlds)
    assert code == 2 and "invalid evaluation config: agent.max_context_tokens=1024" in msg, msg


def test_episode_checks_accept_what_fits(tmp_path):
    """The same checks pass when the turns are raised to what they name, and on the default config;
    the prompt they measure is the one the turn loop builds (system, question, empty memory)."""
    from memsearcher_jax.app.experiment import agent_config, build_setup
    from memsearcher_jax.app.validation import episode_problems, first_prompt_tokens
    from memsearcher_jax.settings import load_settings

    worlds = ("world.cache_dir", str(tmp_path / "worlds"))
    cfg = load_settings(DEFAULT, [worlds, ("world.objectives", "9")])
    setup = build_setup(cfg)
    assert [p.split(":")[0] for p in episode_problems(cfg, setup)] == ["agent.max_turns=4"]
    cfg = cfg.with_values({"agent.max_turns": 18})
    assert episode_problems(cfg, setup) == [] and episode_problems(cfg, setup, training=False) == []
    default = load_settings(DEFAULT, [worlds])
    default_setup = build_setup(default)
    assert episode_problems(default, default_setup) == []
    q = default_setup.train_questions[0]["question"]
    assert first_prompt_tokens(default_setup, agent_config(default), q) == \
        len(default_setup.builder.memsearcher_context(q, ""))


# ----------------------------------------------------------------------------- item 4: resuming another experiment

@pytest.mark.slow
def test_resume_refuses_another_experiment_and_allows_more_steps(tmp_path, capsys):
    """A memsearcher run resumed with agent.workflow=react reused its warm start, mixed two
    workflows in one curve and kept the old em_before (exit 0); only the model shape was compared.
    The run's config is recorded when it starts; a resume that changes the experiment is refused
    naming each key with both values, one that changes the steps or the cadence runs on."""
    import json

    from tests.test_train_step import SMALL

    out = tmp_path / "run"
    args = ["train", "--config", DEFAULT, *[f"--config.{k}={v}" for k, v in SMALL],
            f"--config.world.cache_dir={tmp_path / 'worlds'}", f"--config.train.output_dir={out}",
            "--config.train.save_every=1"]
    assert main(args + ["--config.train.steps=1"]) == 0
    recorded = json.loads((out / "logs" / "run_config.json").read_text())
    assert recorded["agent"]["workflow"] == "memsearcher" and recorded["train"]["steps"] == 1
    metrics = (out / "logs" / "metrics.jsonl").read_text()
    code, msg = _run(capsys, *args, "--config.train.steps=2", "--config.agent.workflow=react",
                     "--config.rl.kl_coef=0.01")
    assert code == 2 and "agent.workflow 'memsearcher' -> 'react'" in msg and "rl.kl_coef 0.001 -> 0.01" in msg, msg
    assert "checkpoint step 1" in msg and "--fresh" in msg and len(msg.strip().splitlines()) == 1
    assert (out / "logs" / "metrics.jsonl").read_text() == metrics  # nothing ran
    code, msg = _run(capsys, *args, "--config.train.steps=2", "--config.train.save_every=2",
                     "--config.train.log_samples_every=1")
    assert code == 0, msg
    assert [json.loads(line)["step"] for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_changed_keys_names_the_experiment_and_lets_the_cadence_change():
    from memsearcher_jax.rules.run_dir import changed_keys, config_record
    from memsearcher_jax.settings.config_utils import load_config

    base = config_record(load_config(DEFAULT))
    now = config_record(load_config(DEFAULT, [("train.steps", "99"), ("train.eval_every", "5"), ("mesh.fsdp", "2"),
                                              ("world.objectives", "2"), ("sft.steps", "10"),
                                              ("rl.reward_fn", "m:f"), ("data.train_path", "x")]))
    assert [k for k, _, _ in changed_keys(base, now)] == ["data.train_path", "rl.reward_fn", "sft.steps",
                                                          "world.objectives"]
    cosine = config_record(load_config(DEFAULT, [("optim.schedule", "cosine")]))
    longer = config_record(load_config(DEFAULT, [("optim.schedule", "cosine"), ("train.steps", "99")]))
    assert changed_keys(cosine, longer) == [("train.steps", 10, 99)]  # the schedule's length
    del now["world"]["objectives"]  # a key only one version has is not compared
    assert "world.objectives" not in [k for k, _, _ in changed_keys(base, now)]


# ----------------------------------------------------------------------------- tracebacks where a message belongs

@pytest.mark.parametrize("kind", ["directory", "json"])
def test_a_config_that_is_a_directory_or_json_is_named(kind, tmp_path, capsys):
    path = tmp_path / ("configs" if kind == "directory" else "c.json")
    path.mkdir() if kind == "directory" else path.write_text("{}")
    code, msg = _run(capsys, "train", "--config", str(path), f"--config.train.output_dir={tmp_path / 'run'}")
    assert code == 2 and f"--config {path}" in msg and "Traceback" not in msg, msg
    assert ("is a directory" if kind == "directory" else "not a .json") in msg
    assert len(msg.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("key, value, named", [
    ("sft.passes", "-1.0", "sft.passes=-1.0: passes over the warm start's rows, expected >= 0"),
    ("sft.name_swap_rate", "2.0", "sft.name_swap_rate=2.0: a share of the demonstrations, expected in [0, 1]"),
    ("sft.tie_embedding_rows", "sometimes", "sft.tie_embedding_rows='sometimes': expected auto, True or False"),
    ("agent.tool", "bing_search", "agent.tool='bing_search' is not a registered tool"),
    ("agent.tool_schema", "{not json", "agent.tool_schema is not valid JSON"),
    ("agent.tool_schema", '{"name": "lookup", "parameters": {}}', "agent.tool_schema 'lookup': no required string"),
    ("agent.multi_answer_prompt", "sometimes", "agent.multi_answer_prompt='sometimes': expected auto, True or False"),
])
def test_a_bad_tool_prompt_or_warm_start_setting_is_refused_before_the_world_is_built(key, value, named, tmp_path,
                                                                                      capsys):
    """These were refused only once the world was built (agent.*: in build_setup) or the warm start
    was about to run (sft.*: in its demonstrations' code, and not at all with sft.steps=0): now
    with every other problem of the config, one line naming the key, before any world or model."""
    out, worlds = tmp_path / "run", tmp_path / "worlds"
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={out}",
                     f"--config.world.cache_dir={worlds}", f"--config.{key}={value}")
    assert code == 2 and named in msg and "Traceback" not in msg, msg
    assert len(msg.strip().splitlines()) == 1 and not worlds.exists() and not out.exists(), msg


@pytest.mark.parametrize("where", ["config", "env"])
def test_a_compilation_cache_at_a_file_or_under_one_is_named(where, tmp_path, capsys, monkeypatch):
    from memsearcher_jax.runtime.compile_stats import CACHE_DIR_ENV

    afile = tmp_path / "afile"
    afile.write_text("mine")
    out = tmp_path / "run"
    for path, words in ((afile, "is a file"), (afile / "sub", f"lies under the file {afile}")):
        if where == "env":
            monkeypatch.setenv(CACHE_DIR_ENV, str(path))
            extra, named = [], f"${CACHE_DIR_ENV}={path}"
        else:
            monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
            extra, named = [f"--config.train.compilation_cache_dir={path}"], f"train.compilation_cache_dir={path}"
        code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={out}",
                         f"--config.world.cache_dir={tmp_path / 'worlds'}", *extra)
        assert code == 2 and named in msg and words in msg, msg
        assert len(msg.strip().splitlines()) == 1 and not out.exists() and afile.read_text() == "mine"


def _pretrain_argv(config, out) -> list[str]:
    """`pretrain` of a tiny model on base_v8's first two phases (config), 3 steps, saved at step 3."""
    overrides = [
        ("model.hidden_size", "32"), ("model.intermediate_size", "64"), ("model.num_layers", "1"),
        ("model.num_heads", "2"), ("model.num_kv_heads", "1"), ("model.head_dim", "16"),
        ("model.positional_heads", "((1,),)"), ("train.steps", "3"), ("train.save_every", "3"),
        ("train.probe_every", "3"), ("train.probe_items", "4"), ("train.final_probe_items", "4"),
        ("train.warmup", "1"), ("train.min_len", "512"), ("train.decay_steps", "0"), ("train.data_workers", "0"),
        ("train.pack_to_max_len", "false"), ("train.output_dir", str(out))]
    return ["pretrain", "--config", str(config), *(f"--config.{k}={v}" for k, v in overrides)]


@pytest.fixture(scope="module")
def short_pretrain(tmp_path_factory):
    """A finished 3-step pretraining run (checkpoint 3): its directory and its config file."""
    from tests.test_pretrain import BASE_V8, SHORT_CONFIG

    d = tmp_path_factory.mktemp("pretrain")
    short = d / "short_base.py"  # base_v8's first two phases, at steps 0 and 2 of 3
    short.write_text(SHORT_CONFIG.format(base=BASE_V8).replace("c.phases[:3], (0, 2, 3), (4, 2, 2)",
                                                                 "c.phases[:2], (0, 2), (4, 2)"))
    assert main(_pretrain_argv(short, d / "run")) == 0
    return d / "run", short


# What a refused command's stderr must not hold besides its message (XLA's own log, e.g. a slow
# constant-folding alarm on a loaded machine, may be there).
NOISE = ("Traceback", "Event loop is closed", "Exception ignored")


def _own_process(argv, timeout=600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "memsearcher_jax.cli", *argv], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_pretrain_checkpoint_of_another_shape_or_truncated_is_one_line(short_pretrain, tmp_path, capsys):
    """`pretrain --probe-step` on a run of another model shape or on a truncated checkpoint, and a
    resumed `pretrain` with another shape: 100-150 lines of Orbax traceback, now one line naming
    the checkpoint (exit 2), and nothing of the run is changed."""
    import shutil

    run, short = tmp_path / "run", short_pretrain[1]
    shutil.copytree(short_pretrain[0], run)
    argv = _pretrain_argv(short, run)
    ckpt = run / "checkpoints"
    before = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*"))
    wider = ["--config.model.hidden_size=64", "--config.model.intermediate_size=128"]
    code, msg = _run(capsys, *argv, *wider, "--probe-step", "3", "--probe-items", "2")
    assert code == 2 and f"checkpoint 3 in {ckpt}" in msg and "another shape" in msg, msg
    assert "Traceback" not in msg and len(_error_lines(msg)) == 1, msg
    # resumed: in its own process, whose exit printed asyncio's "Event loop is closed" 24 times
    done = _own_process([*argv, *wider, "--config.train.steps=4"])
    assert done.returncode == 2 and f"memsearcher-jax: checkpoint 3 in {ckpt}" in done.stderr, done.stderr[-3000:]
    assert "another shape" in done.stderr and "embed" in done.stderr, done.stderr[-3000:]
    # the shapes are compared before any restore starts Orbax's reader threads, whose asyncio errors
    # were printed at the interpreter's exit, after the message
    assert "Traceback" not in done.stderr and "Event loop is closed" not in done.stderr, done.stderr[-3000:]
    assert sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*")) == before
    for path in (ckpt / "3" / "params").rglob("*"):
        if path.is_file() and path.stat().st_size > 64:
            with open(path, "r+b") as f:
                f.truncate(path.stat().st_size // 2)
    shutil.rmtree(run / "base")
    code, msg = _run(capsys, *argv, "--probe-step", "3", "--probe-items", "2")
    assert code == 2 and f"checkpoint 3 in {ckpt}" in msg and "params/" in msg and "Traceback" not in msg, msg
    assert len(_error_lines(msg)) == 1, msg


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated", "missing_item"])
def test_pretrain_from_a_damaged_checkpoint_is_one_line_in_its_own_process(short_pretrain, tmp_path, how):
    """A resumed `pretrain` and `pretrain --probe-step` on a checkpoint whose data file a full disk
    cut short passed the shape check (the metadata is whole), then Orbax's restore failed part-way
    and its pending reads printed asyncio's "Event loop is closed" at exit; a missing item was a
    message about "another shape". Both commands now check the checkpoint as a resumed `train`
    does (rl/checkpoints.py), before any restore: one line naming the checkpoint and the item."""
    import shutil

    from tests.test_cli_errors import _damage

    run, short = tmp_path / "run", short_pretrain[1]
    shutil.copytree(short_pretrain[0], run)
    step_dir = run / "checkpoints" / "3"
    if how == "truncated":
        _damage(step_dir, "truncated")
    else:
        shutil.rmtree(step_dir / "params")
    shutil.rmtree(run / "base")  # the resumed run would export there
    before = sorted(str(p.relative_to(step_dir)) for p in step_dir.rglob("*"))
    argv = _pretrain_argv(short, run)
    for command in ([*argv, "--config.train.steps=4"], [*argv, "--probe-step", "3", "--probe-items", "2"]):
        done = _own_process(command)
        errors = [line for line in done.stderr.splitlines() if line.startswith("memsearcher-jax")]
        assert done.returncode == 2 and len(errors) == 1, (command[-2:], done.stderr[-3000:])
        assert errors[0].startswith(f"memsearcher-jax: checkpoint 3 in {run / 'checkpoints'} cannot be restored "
                                    "(params/"), errors[0]
        assert ("cut short" if how == "truncated" else "params/ is missing") in errors[0], errors[0]
        assert not any(n in done.stderr for n in NOISE), done.stderr[-3000:]
        assert "resumed at step" not in done.stdout  # refused before any restore
    assert sorted(str(p.relative_to(step_dir)) for p in step_dir.rglob("*")) == before


# ----------------------------------------------------------------------------- damaged indexes, odd corpora

def _passages(n: int) -> list[dict]:
    return [{"id": str(i), "contents": f"Title {i}\npassage number {i} about things"} for i in range(n)]


def _truncate(path) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("bm25")
    _write_jsonl(d / "c.jsonl", _passages(4))
    assert main(["index", "--corpus", str(d / "c.jsonl"), "--out", str(d / "idx"), "--index-type", "bm25"]) == 0
    return d / "idx"


@pytest.mark.parametrize("name", ["manifest.json", "bm25/vocab.index.json", "bm25/data.csc.index.npy",
                                  "docs/offsets.npy", "docs/docs.jsonl"])
def test_a_damaged_index_file_is_named(name, bm25_index, tmp_path, capsys):
    """A corrupt manifest.json or BM25 file: exit 1 and a JSON or numpy message naming no file.
    Now exit 2 naming the file, from serve-retriever and from a job that searches the index."""
    import shutil

    damaged = tmp_path / "idx"
    shutil.copytree(bm25_index, damaged)
    _truncate(damaged / name)
    code, msg = _run(capsys, "serve-retriever", "--index", str(damaged), "--port", "1")
    assert code == 2 and str(damaged / name) in msg and "memsearcher-jax index" in msg, msg
    assert "serving" not in msg and len(msg.strip().splitlines()) == 1
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={tmp_path / 'run'}",
                     f"--config.world.cache_dir={tmp_path / 'worlds'}", "--config.retrieval.kind=index",
                     f"--config.retrieval.index_dir={damaged}", "--config.sft.steps=0")
    assert code == 2 and str(damaged / name) in msg and "Traceback" not in msg, msg
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_serve_retriever_on_a_truncated_faiss_index_is_named(tmp_path, capsys):
    from tests.assets import minilm_encoder_dir

    _write_jsonl(tmp_path / "c.jsonl", _passages(4))
    assert main(["index", "--corpus", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "idx"), "--index-type",
                 "flat", "--encoder", minilm_encoder_dir(), "--no-progress"]) == 0
    faiss_file = tmp_path / "idx" / "index.faiss"
    _truncate(faiss_file)
    code, msg = _run(capsys, "serve-retriever", "--index", str(tmp_path / "idx"), "--port", "1", "--no-warmup")
    assert code == 2 and f"{faiss_file} cannot be read" in msg and "truncated" in msg, msg
    assert "Traceback" not in msg and "serving" not in msg


def test_a_corpus_of_stopwords_is_named(tmp_path, capsys):
    _write_jsonl(tmp_path / "c.jsonl", [{"id": str(i), "contents": "the of and, is a!"} for i in range(3)])
    code, msg = _run(capsys, "index", "--corpus", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "idx"),
                     "--index-type", "bm25")
    assert code == 2 and "none of the 3 passages holds a word BM25 can index" in msg, msg
    assert "max() arg" not in msg


def test_skipped_lines_do_not_ask_for_the_flag_that_skipped_them(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    good = [json.dumps(p).encode() for p in _passages(3)]
    corpus.write_bytes(b"\n".join([good[0], '{"id": "9", "contents": "caf\u00e9"}'.encode("latin-1"), *good[1:]]))
    code, msg = _run(capsys, "index", "--corpus", str(corpus), "--out", str(tmp_path / "a"), "--index-type", "bm25")
    assert code == 2 and "line 2: not UTF-8" in msg and "--skip-bad-lines" in msg, msg
    code, msg = _run(capsys, "index", "--corpus", str(corpus), "--out", str(tmp_path / "b"), "--index-type", "bm25",
                     "--skip-bad-lines")
    assert code == 0 and "skipped 1 bad line" in msg and "line 2: not UTF-8" in msg, msg
    assert "--skip-bad-lines" not in msg


@pytest.mark.parametrize("argv,named", [
    (["--workflows", "bogus"], "--workflows 'bogus'"),
    (["--objectives", "abc"], "--objectives 'abc'"),
    (["--objectives", "0"], "--objectives '0'"),
    (["--train-objectives", "0"], "--train-objectives 0"),
    (["--workflows", "react", "--objectives", "1", "--budgets", ""], "settings.json cannot be read"),
])
def test_paper_tables_bad_arguments_are_one_line(argv, named, tmp_path, capsys, monkeypatch):
    """bench/paper_tables.py: tracebacks before; one line and exit 2 now, before anything is written."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import paper_tables
    finally:
        sys.path.remove(os.path.join(ROOT, "bench"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "settings.json").write_text("written by hand, not JSON")
    monkeypatch.setattr(sys, "argv", ["paper_tables.py", *argv, "--out", str(out)])
    capsys.readouterr()
    code = paper_tables.cli()
    err = capsys.readouterr().err
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1, err
    assert os.listdir(out) == ["settings.json"]


def test_a_retriever_of_another_corpus_with_a_warm_start_is_named_before_any_work(bm25_index, tmp_path, capsys):
    """The warm start's demonstrator searched a retriever serving another corpus and stopped with
    a RuntimeError ("did not retrieve the hop-1 fact") after the output dir was made."""
    out = tmp_path / "run"
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={out}",
                     f"--config.world.cache_dir={tmp_path / 'worlds'}", "--config.retrieval.kind=index",
                     f"--config.retrieval.index_dir={bm25_index}")
    assert code == 2 and f"retrieval.index_dir={bm25_index}" in msg and "synthetic world's passages" in msg, msg
    assert "sft.steps=0" in msg and len(msg.strip().splitlines()) == 1 and not out.exists()


# ----------------------------------------------------------------------------- issue 58 item 5: one pass

def test_one_pass_reports_every_problem_of_a_config_together(tmp_path, capsys, monkeypatch):
    """The value rules (experiment), the training values, the input paths and the compilation
    cache were separate validators, each stopping at its own first problem: a config with one
    problem of each kind took four runs to fix. One pass names them all in one message."""
    from memsearcher_jax.runtime.compile_stats import CACHE_DIR_ENV

    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={tmp_path / 'run'}",
                     "--config.rl.group_size=1", "--config.agent.stop_token_ids=abc", "--config.rl.max_refill=-1",
                     f"--config.data.tokenizer_dir={tmp_path / 'nope'}",
                     f"--config.train.compilation_cache_dir={afile}")
    assert code == 2, msg
    for named in ("rl.group_size=1", "agent.stop_token_ids", "rl.max_refill must be >= 0",
                  f"data.tokenizer_dir={tmp_path / 'nope'}: no such directory", f"compilation_cache_dir={afile}"):
        assert named in msg, (named, msg)
    assert not (tmp_path / "run").exists()


def test_group_size_has_one_rule_and_evaluation_asks_for_no_groups():
    from memsearcher_jax.app.experiment import TrainConfigError, config_problems, validate
    from memsearcher_jax.settings.config_utils import load_config

    for size in ("0", "1"):
        cfg = load_config(DEFAULT, [("rl.group_size", size)])
        with pytest.raises(TrainConfigError, match=f"rl.group_size={size}: .* needs >= 2"):
            validate(cfg)
        assert config_problems(cfg, training=False) == []
    assert config_problems(load_config(DEFAULT, [("rl.group_size", "2")])) == []


# The keys each entry point must name for a config with several bad values at once: a value rule,
# a training rule, a tool and a warm-start setting (once only the jobs' validator asked those) and
# an input path. Evaluation runs no groups and no warm start: it names the rest.
SEVERAL_BAD = [("rl.group_size", "1"), ("rl.max_refill", "-1"), ("agent.tool", "bing_search"),
               ("sft.passes", "-1.0"), ("data.tokenizer_dir", "/no/such/tokenizer")]
NAMED = {True: ("rl.group_size=1", "rl.max_refill must be >= 0", "agent.tool='bing_search'", "sft.passes=-1.0",
                "data.tokenizer_dir=/no/such/tokenizer: no such directory"),
         False: ("rl.max_refill must be >= 0", "agent.tool='bing_search'",
                 "data.tokenizer_dir=/no/such/tokenizer: no such directory")}


@pytest.mark.parametrize("training", [True, False])
def test_every_entry_point_reports_the_same_problems_of_a_config(training):
    """experiment.validate (build_trainer, the paper bench, a library user) saw only the value rules;
    the jobs' validation.check_config also saw agent.tool, sft.passes, ... and the input paths. Both
    now run the one pass: the same message, every problem in it."""
    from memsearcher_jax.app import experiment, validation
    from memsearcher_jax.settings.config_utils import load_config

    cfg = load_config(DEFAULT, SEVERAL_BAD)
    with pytest.raises(experiment.TrainConfigError) as by_job:
        validation.check_config(cfg, training=training)
    with pytest.raises(experiment.TrainConfigError) as by_library:
        experiment.validate(cfg, training=training)
    assert str(by_library.value) == str(by_job.value)
    for named in NAMED[training]:
        assert named in str(by_job.value), (named, str(by_job.value))
    assert ("sft.passes" in str(by_job.value)) == training and ("rl.group_size" in str(by_job.value)) == training


@pytest.mark.parametrize("key, value, named", [
    ("sft.passes", "-1.0", "sft.passes=-1.0: passes over the warm start's rows, expected >= 0"),
    ("agent.tool", "bing_search", "agent.tool='bing_search' is not a registered tool"),
])
def test_build_trainer_refuses_a_bad_setting_before_building_anything(key, value, named, monkeypatch):
    """build_trainer checked with experiment.validate, which did not see these settings: it went on
    to build the world and the model, and the value failed later (sft.passes: never, at steps=0)."""
    from memsearcher_jax.app import experiment
    from memsearcher_jax.settings.config_utils import load_config

    def built(*args, **kwargs):
        raise AssertionError("build_trainer built something before refusing the config")

    monkeypatch.setattr(experiment, "build_setup", built)
    monkeypatch.setattr(experiment, "assemble_trainer", built)
    with pytest.raises(experiment.TrainConfigError) as e:
        experiment.build_trainer(load_config(DEFAULT, [(key, value)]))
    assert named in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_the_hosts_rule_is_one_rule_reported_with_the_rest(monkeypatch):
    """rl.batch_questions over the hosts was checked twice (experiment.check_hosts for the live
    run, raised on its own after the other problems; the planner for hardware.hosts) by two copies
    of one message: one rule (distributed.batch_split_problems) now, in the one list."""
    import jax

    from memsearcher_jax.rules.config_rules import config_problems
    from memsearcher_jax.runtime.distributed import batch_split_problems
    from memsearcher_jax.settings.config_utils import load_config

    cfg = load_config(DEFAULT, [("rl.batch_questions", "3"), ("rl.max_refill", "-1")])
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    problems = config_problems(cfg)
    assert batch_split_problems(3, 2)[0] in problems and any("rl.max_refill" in p for p in problems), problems
    assert "rl.batch_questions=3 must be a multiple of the 2 hosts" in batch_split_problems(3, 2)[0]
    assert config_problems(cfg, training=False) == ["rl.max_refill must be >= 0, got -1"]
    assert batch_split_problems(4, 2) == [] and batch_split_problems(3, 1) == []


# ----------------------------------------------------------------------------- issue 82, items 10, 12, 21, 22

@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("key", ["data.eval_path", "data.train_path"])
def test_a_data_path_the_synthetic_world_ignores_is_refused(key, training):
    """With world.enabled=true (the default) every question comes from the synthetic world: a data
    path was ignored without a word (eval with data.eval_path=/nope.jsonl reported the world's EM)."""
    from memsearcher_jax.rules.config_rules import config_problems
    from memsearcher_jax.settings.config_utils import load_config

    problems = config_problems(load_config(DEFAULT, [(key, "/nope.jsonl")]), training, files=False)
    assert len(problems) == 1 and problems[0].startswith(f"{key}=/nope.jsonl") and "world.enabled=false" in problems[0]
    off = load_config(DEFAULT, [(key, "/nope.jsonl"), ("world.enabled", "false")])
    assert not [p for p in config_problems(off, training, files=False) if "is never read" in p]


def test_eval_of_a_data_path_the_world_ignores_is_refused_before_any_work(tmp_path, capsys):
    from memsearcher_jax.bases import DEFAULT_BASE

    worlds = tmp_path / "worlds"
    code, msg = _run(capsys, "eval", "--model", DEFAULT_BASE, "--config", DEFAULT, f"--config.world.cache_dir={worlds}",
                     "--config.data.eval_path=/nope.jsonl", "--limit", "2")
    assert code == 2 and "data.eval_path=/nope.jsonl" in msg and "world.enabled=false" in msg, msg
    assert len(msg.strip().splitlines()) == 1 and not worlds.exists()


@pytest.mark.parametrize("key, value, named", [
    ("sft.steps", "-5", "sft.steps must be >= 0 (0: no warm start), got -5"),
    ("sft.batch_size", "0", "sft.batch_size must be >= 1, got 0"),
    ("sft.warmup", "-1", "sft.warmup must be >= 0, got -1"),
    ("sft.min_len", "1", "sft.min_len must be >= 2, got 1"),
    ("sft.num_demos", "0", "sft.num_demos must be >= 1, got 0"),
    ("sft.learning_rate", "0.0", "sft.learning_rate must be > 0, got 0.0"),
    ("sft.vague_query_rate", "-0.1", "sft.vague_query_rate=-0.1: a share of the demonstrations, expected in [0, 1]"),
    ("sft.two_hop_early_rate", "1.5", "sft.two_hop_early_rate=1.5: a share of the demonstrations, expected in [0, 1]"),
    ("sft.react_share", "-1.0", "sft.react_share=-1.0: a share of the demonstrations, expected in [0, 1]"),
    ("sft.early_answer_rate", "0.9", "sft.vague_query_rate + sft.wrong_answer_rate + sft.early_answer_rate = 1.05"),
])
def test_every_count_and_share_of_the_warm_start_is_checked_with_the_rest(key, value, named):
    """sft.steps=-5 ran with no warm start and exit 0; the other counts and shares ended in a
    ValueError traceback once the warm start began. Each is refused with the config's other problems."""
    from memsearcher_jax.rules.config_rules import config_problems
    from memsearcher_jax.settings.config_utils import load_config

    problems = config_problems(load_config(DEFAULT, [(key, value)]), files=False)
    assert [p for p in problems if named in p], problems
    assert config_problems(load_config(DEFAULT, [(key, value)]), training=False, files=False) == []  # eval: no SFT


def test_a_negative_warm_start_is_refused_before_any_work(tmp_path, capsys):
    out, worlds = tmp_path / "run", tmp_path / "worlds"
    code, msg = _run(capsys, "train", "--config", DEFAULT, "--config.sft.steps=-5", f"--config.train.output_dir={out}",
                     f"--config.world.cache_dir={worlds}")
    assert code == 2 and "sft.steps must be >= 0" in msg and "Traceback" not in msg, msg
    assert not out.exists() and not worlds.exists()


def test_a_plan_far_over_the_host_is_refused_and_a_near_miss_warned(monkeypatch, capsys):
    """On CPU the plan was held against the host's memory only as a warning: group_size 100,000,000
    planned 500,000x the host, ran the warm start and evaluation, and GRPO then allocated until the
    OOM killer ended it. Past machine_rules.HOST_REFUSAL_FACTOR times the host it is refused before
    any work; between 90% of the host and that, the warning stays."""
    from memsearcher_jax.errors import UserInputError
    from memsearcher_jax.plan import planner
    from memsearcher_jax.rules import config_rules, machine_rules
    from memsearcher_jax.settings import load_settings

    cfg = load_settings(DEFAULT)
    plan = planner.plan_memory(cfg)
    need = plan.total_bytes  # one device
    factor = machine_rules.HOST_REFUSAL_FACTOR
    monkeypatch.setattr(planner, "host_memory_bytes", lambda: need // (factor + 1))
    with pytest.raises(UserInputError, match=r"the memory plan's peak \(update\) is .* GiB, 9x this host's"):
        config_rules.check_config(cfg)
    assert "warning" not in capsys.readouterr().out
    monkeypatch.setattr(planner, "host_memory_bytes", lambda: need // 2)  # the near miss: run, with the warning
    config_rules.check_config(cfg)
    assert "over this host's" in capsys.readouterr().out
    monkeypatch.setattr(planner, "host_memory_bytes", lambda: need // (factor + 1))
    config_rules.check_config(cfg, training=False)  # evaluation plans nothing
    # Only on CPU, where the host's memory is the devices'; a configured capacity is check_fits' to refuse.
    host = need // (factor + 1)
    assert machine_rules.host_plan_problem(plan, "cpu", host) is not None
    assert machine_rules.host_plan_problem(plan, "gpu", host) is None
    assert machine_rules.host_plan_problem(plan, "cpu", None) is None
    sized = planner.plan_memory(cfg, device_memory_gib=1024)
    assert machine_rules.host_plan_problem(sized, "cpu", host) is None


def test_a_group_of_a_hundred_million_is_refused_before_any_work(tmp_path, capsys):
    out, worlds = tmp_path / "run", tmp_path / "worlds"
    code, msg = _run(capsys, "train", "--config", DEFAULT, "--config.rl.group_size=100000000",
                     f"--config.train.output_dir={out}", f"--config.world.cache_dir={worlds}")
    assert code == 2 and "the memory plan's peak (rollout)" in msg and "this host's" in msg, msg
    assert "rl.batch_questions x rl.group_size" in msg and "Traceback" not in msg
    assert not out.exists() and not worlds.exists()


def _deny(monkeypatch, path, mode):
    """os.access says no to `mode` on `path` (tests run as root, where chmod stops nothing)."""
    real, path = os.access, os.path.realpath(path)
    monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if os.path.realpath(p) == path and m & mode
                        else real(p, m, *a, **k))


def test_a_world_cache_at_a_file_under_one_or_unwritable_is_named(tmp_path, capsys, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    out = tmp_path / "run"
    for command in ("train", "eval"):
        extra = ["--model", os.path.join(ROOT, "memsearcher_jax", "bases", "reading_v8")] if command == "eval" else \
            [f"--config.train.output_dir={out}"]
        for path, words in ((afile, "is a file"), (afile / "sub", f"lies under the file {afile}")):
            code, msg = _run(capsys, command, "--config", DEFAULT, f"--config.world.cache_dir={path}", *extra)
            assert code == 2 and f"world.cache_dir={path}" in msg and words in msg, msg
            assert len(msg.strip().splitlines()) == 1 and not out.exists() and afile.read_text() == "mine"
    ro = tmp_path / "ro"
    ro.mkdir()
    _deny(monkeypatch, ro, os.W_OK)
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.world.cache_dir={ro / 'worlds'}",
                     f"--config.train.output_dir={out}")
    assert code == 2 and f"world.cache_dir={ro / 'worlds'}: {ro} is not writable" in msg, msg
    assert not out.exists()


def test_a_world_cache_that_holds_worlds_may_be_read_only(tmp_path, monkeypatch):
    """A shared cache of built worlds is read, not written: only an empty one must be writable."""
    from memsearcher_jax.rules.config_rules import config_problems
    from memsearcher_jax.settings.config_utils import load_config

    cache = tmp_path / "worlds"
    (cache / "world-0").mkdir(parents=True)
    _deny(monkeypatch, cache, os.W_OK)
    cfg = load_config(DEFAULT, [("world.cache_dir", str(cache)), ("train.compilation_cache_dir", "")])
    assert not [p for p in config_problems(cfg) if "world.cache_dir" in p]


def _real_data_config(tmp_path, key, value):
    return ["--config.world.enabled=false", f"--config.{key}={value}", "--config.sft.steps=0",
            f"--config.data.tokenizer_dir={os.path.join(ROOT, 'memsearcher_jax', 'bases', 'reading_v8')}",
            f"--config.world.cache_dir={tmp_path / 'worlds'}"]


@pytest.mark.parametrize("layout", ["file", "directory"])
def test_an_unreadable_qa_file_is_named_before_any_work(layout, tmp_path, capsys, monkeypatch):
    from memsearcher_jax.bases import DEFAULT_BASE

    rows = [{"id": "0", "question": "Who?", "golden_answers": ["A"]}]
    qa = tmp_path / "qa.jsonl" if layout == "file" else tmp_path / "data" / "bamboogle" / "test.jsonl"
    _write_jsonl(qa, rows)
    given = qa if layout == "file" else tmp_path / "data"
    _deny(monkeypatch, qa, os.R_OK)
    code, msg = _run(capsys, "eval", "--model", DEFAULT_BASE, "--config", DEFAULT,
                     *_real_data_config(tmp_path, "data.eval_path", given))
    assert code == 2 and f"data.eval_path={given}: {qa} is not readable" in msg and "Traceback" not in msg, msg
    code, msg = _run(capsys, "train", "--config", DEFAULT, f"--config.train.output_dir={tmp_path / 'run'}",
                     *_real_data_config(tmp_path, "data.train_path", qa), f"--config.data.eval_path={given}")
    assert code == 2 and f"data.train_path={qa}: {qa} is not readable" in msg, msg
    assert not (tmp_path / "run").exists() and not (tmp_path / "worlds").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes whatever chmod says")
def test_unreadable_and_unwritable_paths_for_real(tmp_path, capsys):
    from memsearcher_jax.bases import DEFAULT_BASE

    qa = tmp_path / "qa.jsonl"
    _write_jsonl(qa, [{"id": "0", "question": "Who?", "golden_answers": ["A"]}])
    qa.chmod(0)
    code, msg = _run(capsys, "eval", "--model", DEFAULT_BASE, "--config", DEFAULT,
                     *_real_data_config(tmp_path, "data.eval_path", qa))
    assert code == 2 and f"{qa} is not readable" in msg, msg
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    code, msg = _run(capsys, "eval", "--model", DEFAULT_BASE, "--config", DEFAULT, "--out", str(ro / "results"))
    assert code == 2 and f"--out {ro / 'results'}: {ro} is not writable" in msg, msg


@pytest.mark.parametrize("command", ["eval", "export-hf", "train"])
def test_an_output_directory_that_cannot_be_written_is_refused_before_any_work(command, tmp_path, capsys,
                                                                                  monkeypatch):
    """`eval --out` under a read-only directory failed only after the whole evaluation (its results
    lost); `export-hf --out` and train.output_dir with a PermissionError traceback."""
    from memsearcher_jax.bases import DEFAULT_BASE

    ro, worlds = tmp_path / "ro", tmp_path / "worlds"
    ro.mkdir()
    _deny(monkeypatch, ro, os.W_OK)
    target = ro / "out"
    argv = {"eval": ["eval", "--model", DEFAULT_BASE, "--config", DEFAULT, "--out", str(target),
                     f"--config.world.cache_dir={worlds}"],
            "export-hf": ["export-hf", "--checkpoint", str(tmp_path / "run"), "--out", str(target)],
            "train": ["train", "--config", DEFAULT, f"--config.train.output_dir={target}",
                      f"--config.world.cache_dir={worlds}"]}[command]
    code, msg = _run(capsys, *argv)
    named = f"train.output_dir={target}" if command == "train" else f"--out {target}"
    assert code == 2 and f"{named}: {ro} is not writable" in msg and "Traceback" not in msg, msg
    assert not worlds.exists() and not target.exists()
