"""What every config section is made of: a field declared once with its default and its doc line
(`setting`), and the `Section` base its frozen dataclass derives from (read from a ConfigDict
section, written back as a dict, read by attribute or by key like the ConfigDict it replaces)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from memsearcher_jax.errors import UserInputError
from memsearcher_jax.settings.config_utils import ConfigError


class TrainConfigError(UserInputError):
    """The training config is inconsistent; raised before anything is compiled."""


def setting(default: Any, doc: str) -> Any:
    """A config key's field: its default (the one place it lives) and its one-line doc (the
    reference page, docs/config.md, prints it). A default of None marks a key a config may leave
    unset: `Section.to_dict` leaves it out, as the file did."""
    return dataclasses.field(default=default, metadata={"doc": doc})


def doc_of(field: dataclasses.Field) -> str:
    return field.metadata.get("doc", "")


class Section:
    """A config section as a frozen dataclass: field names are its keys. Subclasses set `key`
    (the section's name in the config) and may override `problems`."""

    key: ClassVar[str] = ""

    @classmethod
    def from_section(cls, node: Mapping) -> Section:
        """The section from a ConfigDict section (or a dict): each key the node sets, the others at
        their defaults. ConfigError naming a key the section does not have."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in node.keys() if k not in names]
        if unknown:
            raise ConfigError(f"unknown config key {cls.key}.{unknown[0]}; the keys of {cls.key} are {sorted(names)}")
        return cls(**{k: node[k] for k in node.keys()})

    def to_dict(self) -> dict:
        """Every key and its value; a key unset (None, where None is its default) is left out."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not (getattr(self, f.name) is None and f.default is None)}

    def __getitem__(self, key: str) -> Any:
        """`section[key]`, as a ConfigDict section reads (KeyError for a key it does not have)."""
        if key not in {f.name for f in dataclasses.fields(self)}:
            raise KeyError(f"{self.key}.{key}")
        return getattr(self, key)

    def problems(self, training: bool = True) -> list[str]:
        """This section's own rules: one message per problem, naming `section.key` and what was
        expected ([] when none). training=False: an evaluation's config (no groups, no warm start)."""
        return []


def share_problems(section: str, values: Mapping[str, Any]) -> list[str]:
    """Each value that is a share of something, outside [0, 1], named."""
    return [f"{section}.{k}={v}: a share of the demonstrations, expected in [0, 1]" for k, v in values.items()
            if not 0 <= v <= 1]


def flag_value(value: Any, key: str) -> str:
    """A setting that is "auto", True or False (a bool or its spelling), as "auto" / "true" / "false";
    UserInputError naming the key for anything else."""
    mode = str(value).strip().lower()
    if mode not in ("auto", "true", "false"):
        raise UserInputError(f"{key}={value!r}: expected auto, True or False")
    return mode


def flag_problems(value: Any, key: str) -> list[str]:
    try:
        flag_value(value, key)
    except UserInputError as e:
        return [str(e)]
    return []
