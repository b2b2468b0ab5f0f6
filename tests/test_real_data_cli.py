"""Your own data through the CLI, as the README's "your own data" section runs it.

A tiny random Qwen2 exported with save_pretrained (Qwen tokenizer files from the test extra),
a 50-passage corpus indexed with `memsearcher-jax index --index-type bm25`, the seven paper
sets in the FlashRAG layout (3 questions each) plus a custom file, then `eval` on the folder,
on one set, on the single file, and a one-step `train` on a tiny train file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from flax import nnx

from memsearcher_jax.data.qa import EVAL_SETS
from memsearcher_jax.models import ModelConfig, Qwen2, save_pretrained
from memsearcher_jax.runtime import compile_stats
from tests.assets import qwen_tokenizer_dir

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEOPLE = [f"Person{i}" for i in range(50)]


def cli(*args, check=True):
    env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
    cache = os.environ.get(compile_stats.CACHE_DIR_ENV)
    if cache:  # the session's compilation cache (conftest), which only `train` turns on itself: the
        # evals of the one tiny model load the programs an earlier one compiled instead of compiling them
        env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    res = subprocess.run([sys.executable, "-m", "memsearcher_jax.cli", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    if check and res.returncode != 0:
        raise AssertionError(f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


def write_jsonl(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("own_data")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen_tokenizer_dir())
    model = Qwen2(ModelConfig.tiny(vocab_size=len(tok), num_layers=1, max_position_embeddings=4096,
                                   eos_token_id=tok.convert_tokens_to_ids("<|im_end|>")), rngs=nnx.Rngs(0))
    model_dir = save_pretrained(model, str(root / "model"), tokenizer_dir=qwen_tokenizer_dir())
    write_jsonl(str(root / "corpus.jsonl"),
                [{"id": str(i), "contents": f"{p}\n{p} was born in the city of Town{i}."}
                 for i, p in enumerate(PEOPLE)])
    qa = lambda i: {"id": f"q{i}", "question": f"Where was {PEOPLE[i]} born", "golden_answers": [f"Town{i}"]}
    data = root / "data"
    for k, name in enumerate(EVAL_SETS):
        write_jsonl(str(data / name / f"{EVAL_SETS[name]}.jsonl"), [qa(3 * k + j) for j in range(3)])
    write_jsonl(str(root / "mine.jsonl"), [qa(40 + j) for j in range(3)])
    write_jsonl(str(root / "train.jsonl"), [qa(j) for j in range(8)])
    cli("index", "--corpus", str(root / "corpus.jsonl"), "--out", str(root / "index"), "--index-type", "bm25")
    return {"root": root, "model": model_dir, "data": str(data), "index": str(root / "index")}


def common(files, *extra):
    return ["--config", os.path.join(ROOT, "configs", "default.py"), "--config.world.enabled=false",
            "--config.retrieval.kind=index", f"--config.retrieval.index_dir={files['index']}",
            "--config.agent.max_new_tokens=8", "--config.agent.eval_max_turns=2", "--config.agent.max_turns=2",
            *extra]


def test_eval_every_paper_set_from_a_folder(files, tmp_path):
    out = tmp_path / "eval"
    res = cli("eval", *common(files, f"--config.data.eval_path={files['data']}"), "--model", files["model"],
              "--out", str(out))
    table = res.stdout
    for name in EVAL_SETS:
        assert any(line.split()[:2] == [name, "3"] for line in table.splitlines()), table
    assert "average" in table and "Traceback" not in res.stderr
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 21 and {json.loads(x)["benchmark"] for x in lines} == set(EVAL_SETS)


def test_eval_one_set_and_one_file(files):
    res = cli("eval", *common(files, f"--config.data.eval_path={files['data']}"), "--model", files["model"],
              "--split", "bamboogle")
    rows = [line.split() for line in res.stdout.splitlines() if line.split()[:1] in (["bamboogle"], ["nq"])]
    assert rows == [rows[0]] and rows[0][:2] == ["bamboogle", "3"]
    res = cli("eval", *common(files, f"--config.data.eval_path={files['root'] / 'mine.jsonl'}"),
              "--model", files["model"])
    assert any(line.split()[:2] == ["mine", "3"] for line in res.stdout.splitlines()), res.stdout


def test_bad_input_is_a_message_not_a_traceback(files, capsys):
    # In process (`main(argv)`, as tests/test_cli_errors.py runs the CLI): a refusal comes before
    # anything a subprocess would add, so the process start-up is not worth paying twice here.
    from memsearcher_jax.cli import main

    code = main(["eval", *common(files, f"--config.data.eval_path={files['data']}"), "--model", files["model"],
                 "--split", "nosuchset"])
    err = capsys.readouterr().err
    assert code == 2 and "nosuchset" in err and "Traceback" not in err
    code = main(["eval", *common(files, f"--config.data.eval_path={files['root'] / 'missing.jsonl'}"),
                 "--model", files["model"]])
    err = capsys.readouterr().err
    assert code == 2 and "missing.jsonl" in err and "Traceback" not in err


def test_train_one_grpo_step_on_own_data(files, tmp_path):
    out = tmp_path / "run"
    cli("train", *common(files, f"--config.model.source={files['model']}",
                         f"--config.data.train_path={files['root'] / 'train.jsonl'}",
                         f"--config.data.eval_path={files['root'] / 'mine.jsonl'}",
                         "--config.train.steps=1", "--config.sft.steps=0", "--config.rl.batch_questions=2",
                         "--config.rl.group_size=2", "--config.train.eval_questions=3",
                         f"--config.train.output_dir={out}"))
    assert (out / "checkpoints" / "1").is_dir()
    metrics = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and metrics[0]["rows"] > 0
