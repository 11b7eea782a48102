"""Frozen dataclasses to and from JSON trees, driven by their type hints: how the typed
results (:mod:`traces.results`) read ``metrics.json`` and give it back with the same keys in
the same order, and how a sweep gets its columns from them.

A field's JSON key is its name unless its metadata says ``key``; a field with
``column=False`` in its metadata is not a sweep column (the resolved config, the per-call
rows). The hints understood: ``int``, ``float`` (an int is kept as it is, so a round trip
changes nothing), ``str``, ``bool``, ``X | None``, a dataclass, ``tuple[X, ...]`` (a JSON
list), ``Mapping[str, X]`` (a JSON object, kept in its order, read-only) and ``Any`` (kept
as it is). A class may define its own ``from_json(tree, where)`` / ``to_json()``.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any

from kvsim.errors import KvsimError


class ResultsError(KvsimError, ValueError):
    """A metrics tree does not have the shape of its typed result; the message names the
    entry at fault (``metrics.json: kv_cache.bytes: ...``)."""


def json_key(f: dataclasses.Field) -> str:
    """The JSON key of a dataclass field."""
    return f.metadata.get("key", f.name)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def decode(hint: Any, value: Any, where: str) -> Any:
    """``value`` (a JSON tree) as the type ``hint`` says, or :class:`ResultsError` naming
    ``where``."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        if len(args) != 1:
            raise TypeError(f"{where}: only X | None unions are supported, got {hint}")
        return decode(args[0], value, where)
    if dataclasses.is_dataclass(hint):
        own = getattr(hint, "from_json", None)
        return own(value, where) if own is not None else decode_record(hint, value, where)
    if origin is tuple:
        item, *rest = typing.get_args(hint)
        if rest != [Ellipsis]:
            raise TypeError(f"{where}: only tuple[X, ...] is supported, got {hint}")
        if not isinstance(value, list | tuple):
            raise ResultsError(f"{where}: expected a list, got {_describe(value)}")
        return tuple(decode(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is Mapping:
        _, item = typing.get_args(hint)
        if not isinstance(value, Mapping):
            raise ResultsError(f"{where}: expected an object, got {_describe(value)}")
        return types.MappingProxyType(
            {str(k): decode(item, v, f"{where}.{k}") for k, v in value.items()})
    if hint is float:
        if not _is_number(value):
            raise ResultsError(f"{where}: expected a number, got {_describe(value)}")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ResultsError(f"{where}: expected an integer, got {_describe(value)}")
        return value
    if hint in (str, bool):
        if not isinstance(value, hint):
            raise ResultsError(f"{where}: expected a {hint.__name__}, got {_describe(value)}")
        return value
    raise TypeError(f"{where}: type {hint} is not supported")


def decode_record(cls: type, tree: Any, where: str) -> Any:
    """A dataclass from a JSON object holding exactly its keys (an unknown or missing key
    is an error naming it)."""
    if not isinstance(tree, Mapping):
        raise ResultsError(f"{where}: expected an object, got {_describe(tree)}")
    hints = _hints(cls)
    kw = {}
    known = set()
    for f in dataclasses.fields(cls):
        key = json_key(f)
        known.add(key)
        at = f"{where}.{key}"
        if key not in tree:
            raise ResultsError(f"{at}: missing (a {cls.__name__} has it)")
        kw[f.name] = decode(hints[f.name], tree[key], at)
    unknown = [k for k in tree if k not in known]
    if unknown:
        raise ResultsError(f"{where}.{unknown[0]}: unknown key (no field of {cls.__name__}; "
                           f"known: {', '.join(sorted(known))})")
    return cls(**kw)


def encode(value: Any) -> Any:
    """A typed value as a JSON tree (dataclasses by their fields' keys, in field order)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        own = getattr(value, "to_json", None)
        if own is not None:
            return own()
        return {json_key(f): encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {k: encode(v) for k, v in value.items()}
    return value


def columns(value: Any, prefix: str = "") -> dict[str, Any]:
    """A typed value as one level of dotted names (``decode.time_per_token_s``): a list of
    records by index (``cache_ops[0].time_s``); lists of plain values and fields with
    ``column=False`` are left out."""
    out: dict[str, Any] = {}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        own = getattr(value, "to_json", None)
        if own is not None:  # its own JSON shape: its entries are its columns
            return columns(types.MappingProxyType(own()), prefix)
        for f in dataclasses.fields(value):
            if f.metadata.get("column", True):
                key = json_key(f)
                out.update(columns(getattr(value, f.name), f"{prefix}.{key}" if prefix
                                   else key))
        return out
    if isinstance(value, Mapping):
        for k, v in value.items():
            out.update(columns(v, f"{prefix}.{k}" if prefix else k))
        return out
    if isinstance(value, tuple | list):
        for i, v in enumerate(value):
            if dataclasses.is_dataclass(v) or isinstance(v, Mapping):
                out.update(columns(v, f"{prefix}[{i}]"))
        return out
    out[prefix] = value
    return out


class Record:
    """A typed result (a frozen dataclass) read from and written back to its JSON tree."""

    @classmethod
    def from_metrics(cls, tree: Mapping[str, Any], where: str = "metrics.json") -> Any:
        """The typed result of a JSON tree holding exactly its keys (:class:`ResultsError`
        naming the entry otherwise)."""
        return decode(cls, tree, where)

    def to_metrics(self) -> dict[str, Any]:
        """The JSON tree: ``metrics.json``'s keys, in its order."""
        return encode(self)

    def columns(self) -> dict[str, Any]:
        """One level of dotted names (``decode.time_per_token_s``, ``cache_ops[0].time_s``):
        the row of a sweep. Lists of plain values, the resolved config and the per-call
        rows are left out."""
        return columns(self)


__all__ = ["Record", "ResultsError", "columns", "decode", "decode_record", "encode", "json_key"]
