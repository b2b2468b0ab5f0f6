"""experiment.py: config -> typed dataclasses (one source of truth), validation, evaluation."""
from __future__ import annotations

import os
import re

import pytest

from memsearcher_jax.settings.config_utils import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")


def test_more_optimizer_steps_than_trajectories_is_refused_at_validation():
    from memsearcher_jax.app.experiment import TrainConfigError, validate

    # 2 questions x 2 samples = 4 trajectories (so at least 4 rows): 5 mini-batches leave one empty.
    cfg = load_config(DEFAULT, [("rl.batch_questions", "2"), ("rl.group_size", "2"), ("rl.optimizer_steps", "5")])
    with pytest.raises(TrainConfigError, match=r"rl.optimizer_steps=5 is more than a step.s 4 trajectories"):
        validate(cfg)
    validate(load_config(DEFAULT, [("rl.batch_questions", "2"), ("rl.group_size", "2"), ("rl.optimizer_steps", "4")]))


@pytest.fixture(scope="module")
def qwen_tok():
    from transformers import AutoTokenizer

    from tests.assets import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir())


def test_evaluation_gives_every_trajectory_its_own_id(qwen_tok):
    from memsearcher_jax.agent.prompts import PromptBuilder
    from memsearcher_jax.agent.rollout import AgentConfig, AgentRunner
    from memsearcher_jax.app.experiment import evaluate
    from tests.test_grpo import EchoRetriever, ScriptedSampler

    questions = [{"question": f"Where is {i}?", "golden_answers": ["Paris"]} for i in range(70)]
    builder = PromptBuilder(qwen_tok, default_top_n=2)
    sampler = ScriptedSampler(qwen_tok, builder, {q["question"]: 0 for q in questions})
    runner = AgentRunner(builder, sampler, EchoRetriever(), AgentConfig(max_turns=2, max_new_tokens=32))
    got = evaluate(runner, questions, batch=64)  # two batches: 64 + 6
    ids = [t.traj_id for t in got["trajectories"]]
    assert sorted(ids) == list(range(70))  # unique across batches (each samples from its own id)
    assert [t.group_id for t in got["trajectories"]] == list(range(70))
    assert got["em"] == 1.0


# ----------------------------------------------------------------------------- paths named in code and docs

# A path qualified by a commit (`git show 1a2b3c4:configs/old.py`) names the history, not the tree.
_CONFIG_REF = re.compile(r"(?<![0-9a-f]:)configs/([A-Za-z0-9_]+\.py)(?::([a-z0-9_]+(?:,[a-z0-9_]+)*))?")


def _files_naming_configs():
    for top in ("memsearcher_jax", "bench", "configs", "docs", "retrieval"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            yield from (os.path.join(dirpath, n) for n in names if n.endswith((".py", ".md")))
    yield from (os.path.join(ROOT, n) for n in os.listdir(ROOT) if n.endswith(".md"))


def test_every_config_path_named_in_code_and_docs_exists():
    from memsearcher_jax.settings.config_utils import load_config_module

    refs = {}
    for path in _files_naming_configs():
        with open(path, encoding="utf-8") as f:
            for m in _CONFIG_REF.finditer(f.read()):
                refs.setdefault(m.groups(), []).append(os.path.relpath(path, ROOT))
    assert refs, "no config path found: the pattern is wrong"
    missing = {f"configs/{name}": where for (name, _), where in refs.items()
               if not os.path.isfile(os.path.join(ROOT, "configs", name))}
    assert not missing, f"config files named but absent: {missing}"
    for (name, arg), where in refs.items():  # a named config string must build
        if arg:
            module = load_config_module(os.path.join(ROOT, "configs", name))
            assert module.get_config(arg) is not None, (name, arg, where)
