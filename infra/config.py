"""Typed configuration: dataclasses, YAML files and ``key=value`` overrides.

A job's configuration is a tree of keyword-only dataclasses. ``load_config`` fills it from
(in order) the dataclass defaults, an optional YAML file, and command-line overrides such
as ``detector.score_threshold=0.5``. Values are checked against the annotated types; an
unknown key or a value of the wrong type raises ``ValueError`` naming the key and what is
expected, so a typo never silently becomes a default.

The resolved configuration (``config_to_dict``) is saved next to every output and logged
to MLflow; ``config_digest`` is its content hash.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
_YAML11_WORDS = {"on", "off", "yes", "no", "y", "n"}


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=[x, y]"]`` into a nested dict; values are parsed as YAML scalars."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form key=value (e.g. detector.score_threshold=0.5)")
        dotted, raw = item.split("=", 1)
        if not dotted or any(not part for part in dotted.split(".")):
            raise ValueError(f"override {item!r} has an empty key")
        # YAML 1.1 reads on/off/yes/no as booleans; on the command line they are words.
        value = raw if raw.lower() in _YAML11_WORDS or raw == "" else yaml.safe_load(raw)
        node = tree
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r} conflicts with an earlier override of {part!r}")
        node[parts[-1]] = value
    return tree


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Return ``base`` updated recursively with ``update`` (neither is modified)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert where unambiguous (int -> float, list -> tuple)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, tp, where)
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ValueError(f"{where}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping of {tp.__name__} settings, got {value!r}")
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        return _coerce_sequence(value, tp, where)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        key_tp, val_tp = typing.get_args(tp) or (Any, Any)
        return {_coerce(k, key_tp, where): _coerce(v, val_tp, f"{where}.{k}") for k, v in value.items()}
    return _coerce_scalar(value, tp, where)


def _coerce_union(value: Any, tp: Any, where: str) -> Any:
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(value, arg, where)
        except ValueError as err:
            errors.append(str(err))
    raise ValueError(errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of {_type_name(tp)}")


def _coerce_sequence(value: Any, tp: Any, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where}: expected a list, got {value!r}")
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise ValueError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    item_tp = args[0] if args else Any
    items = [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def _coerce_scalar(value: Any, tp: Any, where: str) -> Any:
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if isinstance(value, str):
            return value
        # YAML parses `key=123` as an int; a string field accepts its text.
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ValueError(f"{where}: expected a string, got {value!r}")
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ValueError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def _over_field_default(f: dataclasses.Field, value: Any) -> Any:
    """A partial mapping for a section whose field default is a configured instance (e.g. a stage's
    ``ray`` defaults) fills the keys it omits from that instance, not from the section class."""
    if not isinstance(value, dict) or f.default_factory is dataclasses.MISSING:
        return value
    try:
        default = f.default_factory()
    except ValueError:  # a section with required settings: nothing to fill from
        return value
    if not dataclasses.is_dataclass(default):
        return value
    return {**{g.name: getattr(default, g.name) for g in dataclasses.fields(default) if g.init}, **value}


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from a (possibly partial) mapping, checking names and types."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, list(fields), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {sorted(fields)}"
        raise ValueError(f"unknown setting {(where + '.' if where else '') + key!r}{hint}")
    kwargs = {}
    for name, value in data.items():
        value = _over_field_default(fields[name], value)
        kwargs[name] = _coerce(value, hints[name], f"{where}.{name}" if where else name)
    try:
        return cls(**kwargs)
    except TypeError as err:  # a required field without a default was not given
        raise ValueError(f"{where or cls.__name__}: {err}") from None


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved configuration as plain YAML/JSON-ready data."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        return value

    return plain(cfg)


def config_digest(cfg: Any, length: int = 16) -> str:
    """Content hash of the resolved configuration (stable across runs and machines)."""
    text = json.dumps(config_to_dict(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Defaults < YAML file < ``key=value`` overrides, returned as a checked ``cls`` instance."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config file {str(path)!r} does not exist")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"config file {str(path)!r} must hold a mapping at the top level")
        data = loaded
    data = deep_merge(data, parse_overrides(overrides or []))
    return from_dict(cls, data)


def dump_config(cfg: Any) -> str:
    """YAML text of the resolved configuration."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
