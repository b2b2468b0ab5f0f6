"""Shared by the launchers: read a recipe's hardware section, print or run shell commands.

No jax here: the launchers run on a laptop that may not have it.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_ENTRY = ["python", "-m", "memsearcher_jax.cli", "--multihost", "train"]  # joins the job, then runs the CLI


def parse_launch_args(parser, argv=None):
    """(args, --config.KEY=VALUE overrides): anything else left over is an error."""
    args, rest = parser.parse_known_args(argv)
    bad = [a for a in rest if not a.startswith("--config.")]
    if bad:
        parser.error(f"unrecognized arguments: {bad} (only --config.KEY=VALUE overrides pass through)")
    return args, rest


class LaunchError(ValueError):
    """A launcher argument or recipe is unusable; the message names it."""


def load_recipe(path: str):
    """The config of `configs/recipe.py:MODEL,POD` (or any config file with a `hardware` section),
    loaded as the CLI loads configs (ml-collections only, no jax)."""
    from memsearcher_jax.settings.config_utils import ConfigError, load_config_file, split_config_path

    if not os.path.isfile(split_config_path(path)[0]):
        raise LaunchError(f"config file not found: {path}")
    try:
        cfg = load_config_file(path)
    except ConfigError as e:
        raise LaunchError(str(e)) from e
    if "hardware" not in cfg:
        raise LaunchError(f"{path} has no `hardware` section (device_kind, num_devices, ...); "
                          "use configs/recipe.py:MODEL,POD")
    return cfg


def repo_relative(path: str) -> str:
    """The config path as the workers see it (inside their copy of the repo), `:ARG` kept."""
    from memsearcher_jax.settings.config_utils import split_config_path

    file, arg = split_config_path(path)
    where = os.path.abspath(file)
    if where.startswith(ROOT + os.sep):
        where = os.path.relpath(where, ROOT)
    return where if arg is None else f"{where}:{arg}"


def retrieval_overrides(mode: str, url: str | None, index_dir: str | None) -> list[str]:
    """`in-process`: every host loads the index itself and serves its own rows;
    `shared`: every host calls one retrieval server."""
    if mode == "shared":
        if not url:
            raise LaunchError("--retrieval shared needs --retrieval-url (e.g. http://10.0.0.2:8000)")
        return ["--config.retrieval.kind=http", f"--config.retrieval.url={url}"]
    if mode == "in-process":
        if not index_dir:
            raise LaunchError("--retrieval in-process needs --index-dir, a directory every host can read")
        return ["--config.retrieval.kind=index", f"--config.retrieval.index_dir={index_dir}"]
    raise LaunchError(f"--retrieval must be in-process or shared, got {mode!r}")


def render(cmd: Sequence[str]) -> str:
    return shlex.join(cmd)


def execute(commands: list[list[str]], dry_run: bool) -> int:
    """Print each command; unless dry_run, run it with its output streamed, stopping at a failure."""
    for cmd in commands:
        print(("" if dry_run else "+ ") + render(cmd), flush=True)
        if dry_run:
            continue
        rc = subprocess.call(cmd)  # inherits our stdout/stderr: remote logs stream straight through
        if rc != 0:
            print(f"command failed with exit code {rc}: {render(cmd)}", file=sys.stderr)
            return rc
    return 0
