"""Ctrl-C (issue 82, item 20): a command interrupted anywhere ends with exit 130 and one line,
never a segmentation fault at the interpreter's teardown (exit 139, 12 of 13 tries during the
warm start, 3 of 3 during `pretrain`) and never a Ctrl-C lost in a gc callback.

The runs are real processes (the console script's path through `cli.main()`), interrupted once
their progress shows in the output (not after a fixed sleep: a busy machine starts slowly)."""
from __future__ import annotations

import gc
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from memsearcher_jax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
# What an interrupted command's output must not hold besides its message.
NOISE = ("Traceback", "Exception ignored", "Segmentation fault", "Fatal Python error")


def _interrupt_when(argv: list[str], progress: str, timeout: float = 600) -> tuple[int, str]:
    """Run `memsearcher-jax ARGV` in its own process, send SIGINT once `progress` (a regex) shows
    in its output, and return (exit status, output)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "memsearcher_jax.cli", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while not re.search(progress.encode(), out):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {progress!r} in the output (exit {proc.poll()}, "
                                     f"{'timed out' if proc.poll() is None else 'ended'}):\n{out.decode()[-3000:]}")
            if select.select([proc.stdout], [], [], 1.0)[0]:
                out += os.read(proc.stdout.fileno(), 65536)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, (out + rest).decode(errors="replace")


def _message(output: str, pattern: str):
    """The match of `pattern` as the output's last words, once (a progress bar or a log line cut by
    the interrupt may precede it on its line)."""
    assert len(re.findall("memsearcher-jax: interrupted", output)) == 1, output[-3000:]
    return re.search(pattern + r"\s*$", output)


@pytest.mark.slow
def test_ctrl_c_during_the_warm_start_exits_130_with_one_line(tmp_path):
    from tests.test_train_step import SMALL

    overrides = dict(SMALL, **{"sft.steps": "100000", "sft.num_demos": "32", "sft.batch_size": "4",
                               "world.cache_dir": str(tmp_path / "worlds"), "train.output_dir": str(tmp_path / "run")})
    code, out = _interrupt_when(["train", "--config", DEFAULT, *(f"--config.{k}={v}" for k, v in overrides.items())],
                                progress=r"sft: +0%\|.*\| [1-9]\d*/100000")  # inside the SFT loop, a step done
    assert code == 130, out[-3000:]
    assert _message(out, r"memsearcher-jax: interrupted"), out[-3000:]
    assert not [n for n in NOISE if n in out], out[-3000:]


@pytest.mark.slow
def test_ctrl_c_during_pretrain_exits_130_keeping_whole_checkpoints(tmp_path):
    from tests.test_pretrain import BASE_V8, SHORT_CONFIG
    from tests.test_validation import _pretrain_argv

    short = tmp_path / "short_base.py"  # base_v8's first two phases
    short.write_text(SHORT_CONFIG.format(base=BASE_V8).replace("c.phases[:3], (0, 2, 3), (4, 2, 2)",
                                                                 "c.phases[:2], (0, 2), (4, 2)"))
    argv = _pretrain_argv(short, tmp_path / "run") + ["--config.train.steps=100000", "--config.train.save_every=1",
                                                      "--config.train.probe_every=100000", "--config.train.log_every=1"]
    code, out = _interrupt_when(argv, progress=r"step 2/100000 loss")
    assert code == 130, out[-3000:]
    said = _message(out, r"memsearcher-jax: interrupted at step (\d+); checkpoint (\d+) kept; resume with the "
                         r"same command")
    assert said, out[-3000:]
    assert not [n for n in NOISE if n in out], out[-3000:]
    # The last save was finished before the process left: the step it names is there, whole, and no
    # save is left half-written.
    ckpts = tmp_path / "run" / "checkpoints"
    assert (ckpts / said[2]).is_dir() and int(said[2]) >= 1
    assert not [p.name for p in ckpts.iterdir() if "tmp" in p.name]


def test_a_ctrl_c_in_a_gc_callback_comes_again_instead_of_being_lost(monkeypatch):
    """Python prints an exception raised in a gc callback ("Exception ignored in _xla_gc_callback")
    and goes on: a Ctrl-C that landed there was lost and the run went on. The handler sends the
    signal again instead; anywhere else it raises KeyboardInterrupt as Python's own does."""
    resent = []
    monkeypatch.setattr(cli, "_send_sigint_again", lambda: resent.append(True))
    with pytest.raises(KeyboardInterrupt):
        cli._on_sigint(signal.SIGINT, sys._getframe())
    assert resent == []

    raised = []

    def callback(phase, info):
        if phase == "start":
            try:
                cli._on_sigint(signal.SIGINT, sys._getframe())
            except KeyboardInterrupt:
                raised.append(True)
    gc.callbacks.append(callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)
    assert raised == [] and resent == [True]

    class Finalized:
        def __del__(self):
            cli._on_sigint(signal.SIGINT, sys._getframe())
    Finalized()
    assert resent == [True, True]


def test_the_handler_is_installed_only_where_python_s_own_is(monkeypatch):
    """A SIGINT the shell set to be ignored (a background job of a script) stays ignored."""
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with cli._ctrl_c_never_lost():
            assert signal.getsignal(signal.SIGINT) is cli._on_sigint
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with cli._ctrl_c_never_lost():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_inside_orbax_comes_again_after_it_returns(monkeypatch):
    """A Ctrl-C that lands while Orbax writes or waits for a checkpoint broke the save (the step was lost,
    Orbax's traceback printed): the handler sends it again, up to its bound, then raises."""
    resent = []
    monkeypatch.setattr(cli, "_send_sigint_again", lambda: resent.append(True))
    monkeypatch.setattr(cli, "_deferred", [0])
    inside = {"cli": cli, "signal": signal, "sys": sys}
    code = compile("def wait_until_finished():\n    cli._on_sigint(signal.SIGINT, sys._getframe())\n",
                   os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "checkpoint_manager.py"), "exec")
    exec(code, inside)
    inside["wait_until_finished"]()
    assert resent == [True]
    monkeypatch.setattr(cli, "_deferred", [cli._ORBAX_DEFERRALS])
    with pytest.raises(KeyboardInterrupt):  # bounded: a save that never returns does not swallow Ctrl-C
        inside["wait_until_finished"]()

