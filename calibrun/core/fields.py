"""Config nodes <-> the dataclasses the code uses: the config schema of a class is made from its fields
(`schema_of`), and the class is built back from a node (`build_from`), so that no option is written twice."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any


def _schema_type(hint):
    """The OmegaConf type of a field of a code class: tuples are lists in a config; a union of a number and a
    tuple (ImageTransform.crop) is Any, checked by the class itself."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is tuple:
        return list[args[0]]
    if typing.get_origin(hint) is dict:
        return dict[args[0], args[1]]
    if len(args) < len(typing.get_args(hint)):  # Optional
        inner = _schema_type(args[0]) if len(args) == 1 else Any
        return Any if inner is Any else inner | None
    if len(args) > 1:
        return Any
    return hint


def _schema_field(value) -> dataclasses.Field:
    if isinstance(value, tuple):
        return field(default_factory=lambda: list(value))
    if isinstance(value, dict):
        return field(default_factory=lambda: dict(value))
    return field(default=value)


def schema_of(name: str, cls: type, first: tuple = (), skip: tuple[str, ...] = (),
              rename: Mapping[str, str] | None = None, doc: str = "") -> type:
    """A config dataclass with the fields of the dataclass `cls` (same order, types, defaults), after the
    (name, type, field) entries `first`; `skip`: fields that are not config keys; `rename`: field -> key."""
    rename = rename or {}
    hints = typing.get_type_hints(cls)
    entries = list(first)
    for f in dataclasses.fields(cls):
        if f.name not in skip:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            entries.append((rename.get(f.name, f.name), _schema_type(hints[f.name]), _schema_field(default)))
    schema = dataclasses.make_dataclass(name, entries)
    schema.__module__ = __name__
    schema.__doc__ = doc
    return schema


def build_from(cls: type, node: Mapping, rename: Mapping[str, str] | None = None, **given):
    """`cls` from a config node (or the dict result.json keeps of it): every key that is a field of `cls`
    (`rename`: key -> field), lists as tuples, an empty list for an optional tuple as None (unset); fields the
    node lacks keep their defaults; `given`: fields set by the caller."""
    rename = rename or {}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key in node:
        name = rename.get(key, key)
        if name not in hints or name in given or name not in {f.name for f in dataclasses.fields(cls)}:
            continue
        value = node[key]
        if isinstance(value, Mapping):
            value = dict(value)
        elif isinstance(value, Sequence) and not isinstance(value, str):
            value = tuple(value) if len(value) or type(None) not in typing.get_args(hints[name]) else None
        kwargs[name] = value
    return cls(**kwargs, **given)
