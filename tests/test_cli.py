"""CLI and config overrides: values land typed, bad keys and values are named, configs load."""
import glob
import os
import subprocess
import sys

import pytest

from memsearcher_jax.cli import main
from memsearcher_jax.config_utils import ConfigError, apply_override, load_config, split_overrides

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


# Files starting with "_" are helpers shared by configs (configs/_recipe_base.py), not configs.
CONFIG_FILES = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))
                      if not os.path.basename(p).startswith("_"))


@pytest.mark.parametrize("path", CONFIG_FILES)
def test_every_config_file_loads(path):
    cfg = load_config(path)
    if os.path.basename(path) == "base_tiny.py":  # the pretraining config: no agent, no RL
        from memsearcher_jax.pretrain import validate_pretrain

        validate_pretrain(cfg)
        return
    assert cfg.rl.group_size >= 1 and cfg.agent.workflow in ("memsearcher", "react")


def test_helper_files_are_not_configs_and_configs_are_all_found():
    assert len(CONFIG_FILES) >= 14
    with pytest.raises(ConfigError, match="no get_config"):
        load_config(os.path.join(ROOT, "configs", "_recipe_base.py"))


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
    from memsearcher_jax.experiment import TrainConfigError, validate

    cfg = load_config(os.path.join(ROOT, "configs/default.py"),
                      [("rl.group_size", "0"), ("retrieval.kind", "http"), ("agent.top_p", "1.5")])
    with pytest.raises(TrainConfigError) as e:
        validate(cfg)
    assert "rl.group_size must be >= 1" in str(e.value) and "retrieval.kind=http needs retrieval.url" in str(e.value)
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

    import memsearcher_jax.jobs as jobs
    from memsearcher_jax.planner import PlanError

    cfg = load_config(os.path.join(ROOT, "configs/default.py"),
                      [("train.output_dir", str(tmp_path / "run")), ("world.cache_dir", str(tmp_path / "w"))])
    cfg.hardware = ml_collections.ConfigDict(dict(device_memory_gib=0.001, usable_fraction=0.9))
    monkeypatch.setattr(jobs, "build_setup", lambda cfg: pytest.fail("set-up ran before the fit check"))
    with pytest.raises(PlanError, match="does not fit|fits: no"):
        jobs.train_job(cfg)
