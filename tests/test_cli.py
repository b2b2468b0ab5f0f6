"""CLI and config overrides: values land typed, bad keys and values are named, configs load."""
import glob
import os
import subprocess
import sys

import pytest

from memsearcher_jax.cli import main
from memsearcher_jax.settings.config_utils import (
    ConfigError,
    apply_override,
    load_config,
    load_config_module,
    split_config_path,
    split_overrides,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_overrides_are_typed_and_validated():
    cfg = load_config(os.path.join(ROOT, "configs/default.py"),
                      [("rl.group_size", "7"), ("model.dtype", "bfloat16"), ("rl.shuffle_rows", "false"),
                       ("optim.learning_rate", "3e-5")])
    assert cfg.rl.group_size == 7 and cfg.model.dtype == "bfloat16"
    assert cfg.rl.shuffle_rows is False and cfg.optim.learning_rate == pytest.approx(3e-5)
    with pytest.raises(ConfigError, match=r"unknown config key --config.rl.nope; valid keys here: \[.*group_size"):
        apply_override(cfg, "rl.nope", "1")
    with pytest.raises(ConfigError, match="no section 'nosuch'"):
        apply_override(cfg, "nosuch.x", "1")
    with pytest.raises(ConfigError, match="expected an integer, got 'many'"):
        apply_override(cfg, "rl.group_size", "many")
    with pytest.raises(ConfigError, match="expected a boolean"):
        apply_override(cfg, "rl.shuffle_rows", "maybe")
    with pytest.raises(ConfigError, match="is a section"):
        apply_override(cfg, "rl", "1")


def test_split_overrides_both_spellings():
    rest, ov = split_overrides(["train", "--config", "c.py", "--config.a.b=1", "--config.c.d", "2", "--fresh"])
    assert rest == ["train", "--config", "c.py", "--fresh"]
    assert ov == [("a.b", "1"), ("c.d", "2")]


# Files starting with "_" would be helpers shared by configs, not configs. configs/recipe.py takes
# MODEL,POD (`configs/recipe.py:qwen2_5_3b,v5e_64`): every pair of its table is a config.
RECIPE = os.path.join(ROOT, "configs", "recipe.py")
RECIPE_PAIRS = sorted(load_config_module(RECIPE).RECIPES)
CONFIG_FILES = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))
                      if not os.path.basename(p).startswith("_") and p != RECIPE) + \
    [f"{RECIPE}:{model},{pod}" for model, pod in RECIPE_PAIRS]


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_config_file_loads(path):
    cfg = load_config(path)
    if os.path.basename(path).startswith("base_"):  # the pretraining configs: no agent, no RL
        from memsearcher_jax.pretrain import validate_pretrain

        validate_pretrain(cfg)
        return
    from memsearcher_jax.agent.workflows import workflow_names

    assert cfg.rl.group_size >= 2 and cfg.agent.workflow in workflow_names()


def test_helper_files_are_not_configs_and_configs_are_all_found(tmp_path):
    assert len(CONFIG_FILES) >= 14 and len(RECIPE_PAIRS) == 12
    helper = tmp_path / "_helper.py"
    helper.write_text("X = 1\n")
    with pytest.raises(ConfigError, match="no get_config"):
        load_config(str(helper))


def test_config_string_selects_the_recipe_and_bad_ones_are_named(tmp_path):
    cfg = load_config(f"{RECIPE}:qwen2_5_7b,v5p_128")
    assert cfg.model.preset == "qwen2_5_7b" and cfg.hardware.accelerator_type == "v5p-128"
    with pytest.raises(ConfigError, match=r"recipe.py.*qwen2_5_3b.*v5e_64"):  # no MODEL,POD: the choices
        load_config(RECIPE)
    with pytest.raises(ConfigError,
                       match=r"refused the argument 'qwen2_5_9b,v5e_64'.*unknown model 'qwen2_5_9b'.*qwen2_5_14b"):
        load_config(f"{RECIPE}:qwen2_5_9b,v5e_64")
    with pytest.raises(ConfigError, match=r"unknown .*pod 'v6e_8'.*h100_8"):
        load_config(f"{RECIPE}:qwen2_5_3b,v6e_8")
    with pytest.raises(ConfigError, match=r"default.py takes no argument"):
        load_config(os.path.join(ROOT, "configs", "default.py") + ":x")
    # Only a ':' after an existing .py file starts an argument: other paths stay whole.
    assert split_config_path(f"{RECIPE}:a,b") == (RECIPE, "a,b")
    assert split_config_path("C:/configs/x.py") == ("C:/configs/x.py", None)
    odd = tmp_path / "a:b.py"
    odd.write_text("import ml_collections\ndef get_config():\n    return ml_collections.ConfigDict(dict(v=1))\n")
    assert split_config_path(str(odd)) == (str(odd), None) and load_config(str(odd)).v == 1
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(os.path.join(ROOT, "configs", "nope.py") + ":a,b")


def test_recipe_config_has_the_recipe_values():
    cfg = load_config(os.path.join(ROOT, "configs/memsearcher_qwen2_5_3b.py"))
    assert (cfg.rl.batch_questions, cfg.rl.group_size, cfg.agent.max_turns, cfg.agent.max_new_tokens,
            cfg.agent.memory_budget, cfg.agent.temperature, cfg.agent.top_p, cfg.optim.learning_rate) == \
        (256, 5, 5, 512, 1024, 1.0, 0.99, 1e-6)
    assert cfg.agent.eval_max_turns == 20 and cfg.rl.kl_coef == 0.001 and cfg.rl.entropy_coef == 0.001


def test_cli_reports_config_errors_with_exit_code_2(capsys):
    assert main(["train", "--config.rl.nope=3"]) == 2
    assert "unknown config key --config.rl.nope" in capsys.readouterr().err
    assert main(["train", "--config", "/nonexistent/x.py"]) == 2
    assert "config file not found: /nonexistent/x.py" in capsys.readouterr().err


def test_training_config_is_validated_before_anything_runs():
    from memsearcher_jax.app.experiment import TrainConfigError, validate

    cfg = load_config(os.path.join(ROOT, "configs/default.py"),
                      [("rl.group_size", "0"), ("retrieval.kind", "http"), ("agent.top_p", "1.5")])
    with pytest.raises(TrainConfigError) as e:
        validate(cfg)
    assert "rl.group_size=0" in str(e.value) and "needs >= 2" in str(e.value)
    assert "retrieval.kind=http needs retrieval.url" in str(e.value)
    cfg = load_config(os.path.join(ROOT, "configs/default.py"), [("agent.top_p", "1.5")])
    with pytest.raises(TrainConfigError, match=r"top_p must be in \(0, 1\]"):
        validate(cfg)


def test_console_script_help():
    exe = os.path.join(os.path.dirname(sys.executable), "memsearcher-jax")
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for cmd in ("train", "eval", "export-hf", "index", "serve-retriever", "plan"):
        assert cmd in out.stdout


def test_train_with_a_bad_value_exits_2_naming_the_key(capsys):
    code = main(["train", "--config", os.path.join(ROOT, "configs/default.py"), "--config.rl.batch_questions=0"])
    assert code == 2
    assert "rl.batch_questions must be >= 1" in capsys.readouterr().err


def test_pipeline_refuses_a_config_that_cannot_fit_before_the_warm_start(tmp_path, monkeypatch):
    import ml_collections

    import memsearcher_jax.app.jobs as jobs
    from memsearcher_jax.plan.planner import PlanError

    cfg = load_config(os.path.join(ROOT, "configs/default.py"),
                      [("train.output_dir", str(tmp_path / "run")), ("world.cache_dir", str(tmp_path / "w"))])
    cfg.hardware = ml_collections.ConfigDict(dict(device_memory_gib=0.001, usable_fraction=0.9))
    monkeypatch.setattr(jobs, "build_setup", lambda cfg: pytest.fail("set-up ran before the fit check"))
    with pytest.raises(PlanError, match="does not fit|fits: no"):
        jobs.train_job(cfg)


def test_pretrain_records_the_argv_it_parsed_not_sys_argv(monkeypatch):
    """Issue 27 defect 5: under --multihost, or with main(argv) called from code, sys.argv[2:]
    is not the command that ran."""
    from memsearcher_jax import pretrain

    seen = {}
    monkeypatch.setattr(pretrain, "run_pretrain", lambda cfg, resume, argv: seen.update(argv=argv))
    monkeypatch.setattr(sys, "argv", ["memsearcher-jax", "--multihost", "pretrain", "--fresh"])
    assert main(["pretrain", "--config.train.steps=3", "--fresh"]) == 0
    assert seen["argv"] == ["--config.train.steps=3", "--fresh"]
