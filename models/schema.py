"""The base of every validated config section (models, bits, hardware, runs, serving) and
the one-line error message their validation errors become.

Every section is frozen, refuses unknown keys, refuses ``inf``/``nan`` for numbers (an
infinite bandwidth or latency is never meant, and it only fails later, far from the
config: ``inf`` ns cannot become integer picoseconds) and refuses a boolean where a number
is due (pydantic's lax mode would read ``true`` as 1).
"""

from __future__ import annotations

import difflib
import re
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

_LEADING_FIELD = re.compile(r"^([a-z_][a-z0-9_]*): (.*)$", re.DOTALL)


def _admits_bool(annotation: Any) -> bool:
    if annotation is bool or annotation is Any:
        return True
    return any(_admits_bool(a) for a in get_args(annotation) if not isinstance(a, str))


class Frozen(BaseModel):
    """A validated, immutable config section."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, data: Any) -> Any:
        # A model-level check (a "before" field validator on "*" would also run on the
        # discriminator fields of tagged unions, which pydantic forbids).
        if isinstance(data, dict):
            for name, v in data.items():
                f = cls.model_fields.get(name) if isinstance(name, str) else None
                if (isinstance(v, bool) and f is not None and not _admits_bool(f.annotation)
                        and _admits_number(f.annotation)):
                    raise ValueError(f"{name}: expected a number, got the boolean "
                                     f"{str(v).lower()}")
        return data

    @model_validator(mode="before")
    @classmethod
    def _unknown_keys_named(cls, data: Any) -> Any:
        # Refused here rather than by ``extra="forbid"`` so that the message can list the
        # section's valid keys and the nearest one (pydantic's says only "extra inputs").
        if isinstance(data, dict):
            unknown = [k for k in data if isinstance(k, str) and k not in cls.model_fields]
            if unknown:
                raise ValueError(unknown_key_message(cls, unknown[0]))
        return data


def _sections(annotation: Any) -> list[type[Frozen]]:
    """The config sections an annotation can hold (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, Frozen):
        return [annotation]
    return [s for a in get_args(annotation) for s in _sections(a)]


def nearest_key(section: type[Frozen], key: str) -> str | None:
    """The valid key nearest to ``key``: a close spelling of one of the section's keys, or
    ``sub.key`` when ``key`` is a key of one of its sub-sections (``hardware.pcie`` ->
    ``host_link.pcie``); None when nothing is near."""
    close = difflib.get_close_matches(key, list(section.model_fields), n=1, cutoff=0.6)
    if close:
        return close[0]
    for name, f in section.model_fields.items():
        for sub in _sections(f.annotation):
            if key in sub.model_fields:
                return f"{name}.{key}"
    for name, f in section.model_fields.items():
        for sub in _sections(f.annotation):
            close = difflib.get_close_matches(key, list(sub.model_fields), n=1, cutoff=0.8)
            if close:
                return f"{name}.{close[0]}"
    return None


def unknown_key_message(section: type[Frozen], key: str) -> str:
    """``<key>: unknown key (did you mean 'x'?); valid keys here: a, b, c``. The parts
    are joined by commas and parentheses, never by ``;`` (which separates problems)."""
    near = nearest_key(section, key)
    hint = f" (did you mean {near!r}?)" if near else ""
    valid = ", ".join(section.model_fields)
    return f"{key}: unknown key{hint}, valid keys here: {valid}"


def _admits_number(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    return any(_admits_number(a) for a in get_args(annotation) if not isinstance(a, str))


def _format_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def validation_message(err: ValidationError, prefix: str = "") -> str:
    """One ``path: message`` per problem, ``;``-joined, each naming the field path."""
    lines = []
    for e in err.errors():
        loc = _format_loc(e["loc"])
        path = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
            # Cross-field checks start their message with the field at fault: move it
            # into the path so every error reads "<where>.<field>: <problem>".
            m = _LEADING_FIELD.match(msg)
            if m:
                loc, msg = ".".join(filter(None, (loc, m.group(1)))), m.group(2)
                path = f"{prefix}.{loc}" if prefix else loc
        lines.append(f"{path}: {msg}" if path else msg)
    return "; ".join(lines)


__all__ = ["Frozen", "nearest_key", "unknown_key_message", "validation_message"]
