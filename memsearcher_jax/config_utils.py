"""ml-collections config files, chosen with --config and overridden with --config.a.b=value.

A config file is a Python file with `get_config() -> ml_collections.ConfigDict`. Overrides are
type-checked against the value already in the config; an unknown key is an error that lists
the keys that do exist at that level.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import sys
from typing import Any, Sequence

import ml_collections

from memsearcher_jax.errors import UserInputError


class ConfigError(UserInputError):
    """A config file or command-line override is invalid."""


def load_config_file(path: str) -> ml_collections.ConfigDict:
    if not os.path.exists(path):
        raise ConfigError(f"config file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"_memsearcher_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    # A config may import helpers that sit beside it (configs/_recipe_base.py): its folder goes
    # on sys.path while it runs, and only then.
    config_dir = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, config_dir)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # surface the file name with whatever went wrong inside it
        raise ConfigError(f"error while executing config file {path}: {type(e).__name__}: {e}") from e
    finally:
        sys.path.remove(config_dir)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path} has no get_config() function")
    cfg = module.get_config()
    if not isinstance(cfg, ml_collections.ConfigDict):
        raise ConfigError(f"get_config() in {path} returned {type(cfg).__name__}, expected ml_collections.ConfigDict")
    return cfg


def _parse_value(text: str, current: Any, key: str) -> Any:
    if isinstance(current, bool):
        low = text.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ConfigError(f"--config.{key}: expected a boolean (true/false), got {text!r}")
    if isinstance(current, int):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"--config.{key}: expected an integer, got {text!r}") from None
    if isinstance(current, float):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--config.{key}: expected a number, got {text!r}") from None
    if isinstance(current, str):
        return text
    if isinstance(current, (tuple, list)):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = tuple(s.strip() for s in text.split(",") if s.strip())
        if not isinstance(value, (tuple, list)):
            value = (value,)
        return type(current)(value)
    # None or other: best effort literal, else the string.
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_override(cfg: ml_collections.ConfigDict, dotted: str, text: str) -> None:
    parts = dotted.split(".")
    node = cfg
    for i, part in enumerate(parts[:-1]):
        if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
            where = ".".join(parts[:i]) or "<root>"
            raise ConfigError(f"unknown config key --config.{dotted}: {where} has no section {part!r}; "
                              f"sections: {sorted(k for k in node.keys() if isinstance(node[k], ml_collections.ConfigDict))}")
        node = node[part]
    leaf = parts[-1]
    if leaf not in node:
        raise ConfigError(f"unknown config key --config.{dotted}; valid keys here: {sorted(node.keys())}")
    current = node[leaf]
    if isinstance(current, ml_collections.ConfigDict):
        raise ConfigError(f"--config.{dotted} is a section, not a value; set one of {sorted(current.keys())}")
    value = _parse_value(text, current, dotted)
    with node.ignore_type():
        node[leaf] = value


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Separate `--config.x.y=v` / `--config.x.y v` overrides from the other arguments."""
    rest, overrides = [], []
    i = 0
    argv = list(argv)
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--config."):
            body = arg[len("--config."):]
            if "=" in body:
                key, value = body.split("=", 1)
            else:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{arg} needs a value")
                key, value = body, argv[i + 1]
                i += 1
            overrides.append((key, value))
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def load_config(path: str, overrides: Sequence[tuple[str, str]] = ()) -> ml_collections.ConfigDict:
    cfg = load_config_file(path)
    for key, value in overrides:
        apply_override(cfg, key, value)
    return cfg
