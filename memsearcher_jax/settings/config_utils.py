"""ml-collections config files, chosen with --config and overridden with --config.a.b=value.

A config file is a Python file with `get_config() -> ml_collections.ConfigDict`; `file.py:ARG`
calls `get_config(ARG)` instead (`--config configs/recipe.py:qwen2_5_3b,v5e_64`). Overrides are
type-checked against the value already in the config; an unknown key is an error that lists
the keys that do exist at that level. A command also holds the file's own keys against the keys
its code reads (`Schema`, `schema_problems`): a misspelled key in a file is refused as an override is.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import functools
import importlib.util
import inspect
import os
import sys
from collections.abc import Sequence
from typing import Any

import ml_collections

from memsearcher_jax.errors import UserInputError


class ConfigError(UserInputError):
    """A config file or command-line override is invalid."""


CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "configs")  # the repo's configs/, three folders up from memsearcher_jax/settings/


@dataclasses.dataclass(frozen=True)
class Schema:
    """The keys a config may set, as dotted names: every value and section of a reference config
    (one that sets every key its code reads, e.g. configs/default.py) and the optional ones the
    code reads when present. `required`: the sections a config must have (the rules read them)."""
    name: str                 # the reference, for messages
    keys: frozenset           # dotted names of values
    sections: frozenset       # dotted names of sections
    required: frozenset       # the reference's top-level sections: a config must have each
    optional: frozenset = frozenset()  # dotted names of the keys a config may leave out


def schema_of(reference: ml_collections.ConfigDict, name: str, optional: dict | None = None) -> Schema:
    """`reference`'s keys, plus `optional` ({section: keys}: keys the code reads when present; a
    section the reference lacks may be absent). Every section of the reference is required."""
    keys, sections = set(), set()

    def walk(node, prefix):
        for k in node.keys():
            dotted = f"{prefix}{k}"
            if isinstance(node[k], ml_collections.ConfigDict):
                sections.add(dotted)
                walk(node[k], dotted + ".")
            else:
                keys.add(dotted)
    walk(reference, "")
    for section, extra in (optional or {}).items():
        sections.add(section)
        keys.update(f"{section}.{k}" for k in extra)
    required = {s for s in reference.keys() if isinstance(reference[s], ml_collections.ConfigDict)}
    optional_keys = {f"{section}.{k}" for section, extra in (optional or {}).items() for k in extra}
    return Schema(name, frozenset(keys), frozenset(sections), frozenset(required), frozenset(optional_keys))


# The keys a training or evaluation config may set: configs/default.py's (it sets every key the jobs
# read), and these, read only where a config sets them: model.vocab_size (the plan of a
# model.source='init' config, memory_estimates) and a pod's hardware section (configs/recipe.py;
# planner, memory_estimates, launch/). A pretraining config: configs/base_v8.py's keys.
OPTIONAL_KEYS = {"model": ("vocab_size",),
                 "hardware": ("device_kind", "num_devices", "device_memory_gib", "hosts", "usable_fraction",
                              "accelerator_type", "runtime_version", "nodes", "gpus_per_node")}


@functools.lru_cache(maxsize=1)
def training_schema() -> Schema | None:
    """The keys of a training or evaluation config (configs/default.py's and OPTIONAL_KEYS); None
    where the package has no configs/ beside it (installed without the repository)."""
    path = os.path.join(CONFIGS_DIR, "default.py")
    return schema_of(load_config_file(path), "configs/default.py", OPTIONAL_KEYS) if os.path.isfile(path) else None


@functools.lru_cache(maxsize=1)
def pretrain_schema() -> Schema | None:
    """The keys of a pretraining config: configs/base_v8.py's (the shipped base's config sets every one)."""
    path = os.path.join(CONFIGS_DIR, "base_v8.py")
    return schema_of(load_config_file(path), "configs/base_v8.py") if os.path.isfile(path) else None


def missing_keys(cfg: ml_collections.ConfigDict, schema: Schema | None) -> list[str]:
    """The keys of `schema` (but its optional ones) that `cfg` lacks, dotted."""
    def has(dotted: str) -> bool:
        node = cfg
        for part in dotted.split("."):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                return False
            node = node[part]
        return True
    return sorted(k for k in (schema.keys if schema else ()) if k not in schema.optional and not has(k))


def closest_key(dotted: str, schema: Schema) -> str | None:
    """The known key `dotted` most likely meant: a near spelling in its own section, then the same
    name in another section, then a near spelling anywhere."""
    section, _, leaf = dotted.rpartition(".")
    known = sorted(schema.keys | schema.sections)
    mates = [k for k in known if k.rpartition(".")[0] == section]
    for candidates, target, cutoff in ((mates, dotted, 0.8), ([k for k in known if k.rpartition(".")[2] == leaf],
                                                             dotted, 0.0), (known, dotted, 0.75)):
        found = difflib.get_close_matches(target, candidates, n=1, cutoff=cutoff)
        if found:
            return found[0]
    return None


def schema_problems(cfg: ml_collections.ConfigDict, schema: Schema) -> list[str]:
    """Each key of `cfg` the schema does not know (named with the closest known key), each value
    set where a section belongs, and each required section `cfg` lacks; [] when none."""
    problems = [f"the config has no {s} section (every section of {schema.name} is read; a config file starts "
                f"from its get_config() and changes what it needs)" for s in sorted(schema.required)
                if not isinstance(cfg.get(s, None), ml_collections.ConfigDict)]

    def walk(node, prefix):
        for k in node.keys():
            dotted, value = f"{prefix}{k}", node[k]
            if dotted in schema.sections and not isinstance(value, ml_collections.ConfigDict):
                if "." in dotted:  # a top-level one is a missing section, reported above
                    problems.append(f"{dotted} is a section of {schema.name}, not a value")
            elif dotted in schema.sections:
                walk(value, dotted + ".")
            elif dotted not in schema.keys:
                near = closest_key(dotted, schema)
                problems.append(f"unknown config key {dotted}" + (f": did you mean {near}?" if near else "")
                                + f" (the keys a config may set are {schema.name}'s)")
    walk(cfg, "")
    return problems


def split_config_path(path: str) -> tuple[str, str | None]:
    """`configs/recipe.py:qwen2_5_3b,v5e_64` -> ("configs/recipe.py", "qwen2_5_3b,v5e_64"), the
    ml-collections config-string convention. Split on the last ':' only when what precedes it is an
    existing .py file, so any other path (one with a drive letter, a plain file) is kept whole with
    no argument."""
    head, sep, arg = path.rpartition(":")
    if sep and head.endswith(".py") and os.path.isfile(head):
        return head, arg
    return path, None


def load_config_module(path: str):
    """Execute a config file (no argument part) and return it as a module."""
    if not os.path.exists(path):
        raise ConfigError(f"config file not found: {path}")
    if os.path.isdir(path):
        raise ConfigError(f"--config {path} is a directory: give a config file (e.g. configs/default.py)")
    if not path.endswith(".py"):
        raise ConfigError(f"--config {path}: a config is a Python file with get_config() (e.g. configs/default.py), "
                          f"not a {os.path.splitext(path)[1] or 'file without an extension'}; override values "
                          "with --config.SECTION.KEY=VALUE")
    spec = importlib.util.spec_from_file_location(f"_memsearcher_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    # A config may import helpers that sit beside it: its folder goes on sys.path while it runs,
    # and only then.
    with _on_sys_path(os.path.dirname(os.path.abspath(path))):
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # surface the file name with whatever went wrong inside it
            raise ConfigError(f"error while executing config file {path}: {type(e).__name__}: {e}") from e
    return module


def load_config_file(path: str) -> ml_collections.ConfigDict:
    """get_config() of a config file, or get_config(ARG) for `file.py:ARG`."""
    file, arg = split_config_path(path)
    module = load_config_module(file)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {file} has no get_config() function")
    args = () if arg is None else (arg,)
    if arg is not None:
        try:
            inspect.signature(module.get_config).bind(arg)
        except TypeError:
            raise ConfigError(f"config file {file} takes no argument (its get_config() has no parameter), "
                              f"but was given {file}:{arg}") from None
        except ValueError:  # no signature to inspect: let the call decide
            pass
    with _on_sys_path(os.path.dirname(os.path.abspath(file))):
        try:
            cfg = module.get_config(*args)
        except Exception as e:
            given = "" if arg is None else f" refused the argument {arg!r}"
            raise ConfigError(f"config file {file}{given}: get_config() raised {type(e).__name__}: {e}") from e
    if not isinstance(cfg, ml_collections.ConfigDict):
        raise ConfigError(f"get_config() in {file} returned {type(cfg).__name__}, expected ml_collections.ConfigDict")
    return cfg


@contextlib.contextmanager
def _on_sys_path(folder: str):
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


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


def _apply_in_list(node, parts: list[str], dotted: str, text: str) -> None:
    """An override inside a list of dicts (`--config.phases.2.learning_rate=1e-4`): parts[0] an
    index, then keys of plain dicts down to an existing value."""
    for part in parts[:-1]:
        if isinstance(node, (list, tuple)):
            if not (part.isdigit() and int(part) < len(node)):
                raise ConfigError(f"--config.{dotted}: {part!r} is not an index of a list of {len(node)}")
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise ConfigError(f"unknown config key --config.{dotted}: no {part!r} there; "
                              f"keys: {sorted(node) if isinstance(node, dict) else 'none'}")
    leaf = parts[-1]
    if not isinstance(node, dict) or leaf not in node or isinstance(node[leaf], (dict, ml_collections.ConfigDict)):
        where = f"valid keys here: {sorted(node)}" if isinstance(node, dict) else "it names no single value"
        raise ConfigError(f"unknown config key --config.{dotted}; {where}")
    node[leaf] = _parse_value(text, node[leaf], dotted)


def apply_override(cfg: ml_collections.ConfigDict, dotted: str, text: str) -> None:
    parts = dotted.split(".")
    node = cfg
    for i, part in enumerate(parts[:-1]):
        if part in node and isinstance(node[part], (list, tuple)) and node[part] and \
                all(isinstance(x, dict) for x in node[part]):
            return _apply_in_list(node[part], parts[i + 1:], dotted, text)
        if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
            where = ".".join(parts[:i]) or "<root>"
            sections = sorted(k for k in node.keys() if isinstance(node[k], ml_collections.ConfigDict))
            raise ConfigError(f"unknown config key --config.{dotted}: {where} has no section {part!r}; "
                              f"sections: {sections}")
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


def load_config(path: str, overrides: Sequence[tuple[str, str]] = (),
                schema: Schema | None = None) -> ml_collections.ConfigDict:
    """The config of a file with its overrides; with `schema`, the file's own keys are held
    against it first (ConfigError naming each unknown key and its closest known one)."""
    cfg = load_config_file(path)
    problems = schema_problems(cfg, schema) if schema is not None else []
    if len(problems) > 8:  # another command's config: its first lines say so
        problems = problems[:8] + [f"... and {len(problems) - 8} more"]
    if problems:
        raise ConfigError(f"{path}: " + problems[0] if len(problems) == 1
                          else f"{path}:\n  - " + "\n  - ".join(problems))
    for key, value in overrides:
        apply_override(cfg, key, value)
    return cfg
