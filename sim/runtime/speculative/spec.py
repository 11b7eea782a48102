"""The drafter spec string of speculative decoding (``kvsim generate --speculate``, a run
config's ``[speculate] drafter``, ``[serving.speculate] drafter``)::

    prompt-lookup:k=4              n-gram lookup in the prompt and the output so far
    prompt-lookup:k=8,ngram=2      (longest n-gram tried: ngram, default 3, down to 1)
    self:layers=26,k=2             the model itself with 30 - 26 layers skipped
    self:skip=14-17,k=2            ... naming the skipped block of layers
    ...,cut=window|rejected|host   how the rejected drafts leave the cache

``k`` (default 4) is the most tokens drafted per verification call: the call holds them
and the last accepted token (k + 1 tokens) and its rejected tail is cut with the
runtime's ``filter_cache_tail``, which takes a tail of at most 32 tokens (FACTS.md), so
``k <= 31``. ``cut``:

- ``window`` (default): ``filter_cache_tail(cache_size, k + 1, mask)`` over the verified
  window, the mask true for the tokens kept, as host code written for the vendor's call
  does (the zoo-style host program in ``tests/sim/zoo_host.py``): the runtime rewrites
  the kept tokens in place;
- ``rejected``: ``filter_cache_tail`` over the rejected tokens only, all masked out: the
  call drops them and moves nothing;
- ``host``: no call. The host tracks ``cache_size`` (FACTS.md) and rejected drafts are
  always a suffix of the cache, so the next call at the smaller ``cache_size`` simply
  overwrites them.

Every error names the spec, the key at fault and what is valid.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Literal

from kvsim.errors import ConfigError

#: Drafters and the keys each takes.
METHODS = {"prompt-lookup": ("k", "ngram", "cut"), "self": ("layers", "skip", "k", "cut")}
CUTS = ("window", "rejected", "host")
#: The vendor's filter_cache_tail cuts a tail of at most this many tokens (FACTS.md).
TAIL_MAX = 32
#: Most tokens drafted per verification: the verified window (k + 1) must fit the tail.
MAX_K = TAIL_MAX - 1
DEFAULT_K = 4
#: Longest n-gram prompt lookup matches by default (it tries ngram, ngram - 1, ..., 1).
DEFAULT_NGRAM = 3
MAX_NGRAM = 16

Cut = Literal["window", "rejected", "host"]


@dataclass(frozen=True)
class DraftSpec:
    """A parsed drafter spec (see the module docstring)."""

    method: Literal["prompt-lookup", "self"]
    k: int = DEFAULT_K
    ngram: int = DEFAULT_NGRAM
    layers: int | None = None  # self: layers the draft runs
    skip: tuple[int, int] | None = None  # self: first and last skipped layer
    cut: Cut = "window"

    def text(self) -> str:
        """The canonical spec string."""
        if self.method == "prompt-lookup":
            keys = [f"k={self.k}", f"ngram={self.ngram}"]
        elif self.skip is not None:
            keys = [f"skip={self.skip[0]}-{self.skip[1]}", f"k={self.k}"]
        else:
            keys = [f"layers={self.layers}", f"k={self.k}"]
        if self.cut != "window":
            keys.append(f"cut={self.cut}")
        return f"{self.method}:{','.join(keys)}"

    def keep(self, num_layers: int, *, where: str = "drafter") -> tuple[int, ...]:
        """The layers a self-draft of a model of ``num_layers`` (``L``) layers runs.
        ``layers=N`` skips one block of ``n = L - N`` layers around the middle: from layer
        ``L // 2 - n // 2 + 1`` (moved down if needed so the last layer is kept). On
        SmolLM2-135M's float model (30 layers; agreement of the layer-skipping model's
        next token with the full model's over 200 tokens of ``models/data/english.txt``,
        every starting layer tried), that block was the best of all for 4 skipped layers
        (from layer 14: 0.735) and for 8 (from 12: 0.515, against 0.335 from the middle
        layer and 0.49 for the first 26 layers alone), and within 0.09 of the best for 2
        (from 15: 0.725; best from 16: 0.815)."""
        if self.method != "self":
            raise ConfigError(f"{where}: {self.method} drafts without the model's layers")
        L = num_layers
        if self.skip is not None:
            a, b = self.skip
            if not 0 <= a <= b < L:
                raise ConfigError(f"{where}: skip={a}-{b} must lie in 0..{L - 1} (the model "
                                  f"has {L} layers)")
            if b - a + 1 >= L:
                raise ConfigError(f"{where}: skip={a}-{b} skips every layer")
            return tuple(i for i in range(L) if not a <= i <= b)
        assert self.layers is not None
        if not 1 <= self.layers < L:
            raise ConfigError(f"{where}: layers={self.layers} must be 1..{L - 1}: the draft "
                              f"runs fewer layers than the model's {L}")
        n = L - self.layers
        a = max(0, min(L // 2 - n // 2 + 1, L - 1 - n))
        return tuple(i for i in range(L) if not a <= i < a + n)


def _int(head: str, key: str, value: str, lo: int, hi: int | None, why: str = "") -> int:
    if not re.fullmatch(r"\d+", value):
        raise ConfigError(f"{head}: {key} must be an integer, got {value!r}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(f"{head}: {key}={v} must be {span}{why}")
    return v


def parse_speculate(text: str, *, where: str = "--speculate") -> DraftSpec:
    """A :class:`DraftSpec` from ``METHOD[:key=value,...]``, or a :class:`ConfigError`
    naming ``where``, the spec and what is wrong with it."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where + ': ' if where else ''}expected a drafter spec such as "
                          f"'prompt-lookup:k=4' or 'self:layers=24,k=2', got {text!r}")
    spec = text.strip()
    head = f"{where} {spec!r}" if where else repr(spec)
    method, _, rest = spec.partition(":")
    method = method.strip()
    if method not in METHODS:
        near = difflib.get_close_matches(method, METHODS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"{head}: unknown drafter {method!r}{hint}; valid: "
                          f"{', '.join(METHODS)}")
    valid = METHODS[method]
    values: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))) if rest.strip() else ():
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise ConfigError(f"{head}: {item!r} is not key=value")
        if key not in valid:
            near = [v for v in valid if v.startswith(key)] or difflib.get_close_matches(
                key, valid, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"{head}: unknown key {key!r}{hint}; {method} takes "
                              f"{', '.join(valid)}")
        if key in values:
            raise ConfigError(f"{head}: {key} is given twice")
        values[key] = value
    s = head
    k = _int(s, "k", values["k"], 1, MAX_K, f" (the verified window of k + 1 tokens is cut "
             f"with filter_cache_tail, whose tail holds at most {TAIL_MAX})") \
        if "k" in values else DEFAULT_K
    cut = values.get("cut", "window")
    if cut not in CUTS:
        raise ConfigError(f"{head}: cut={cut!r}; valid: {', '.join(CUTS)}")
    if method == "prompt-lookup":
        ngram = (_int(s, "ngram", values["ngram"], 1, MAX_NGRAM) if "ngram" in values
                 else DEFAULT_NGRAM)
        return DraftSpec("prompt-lookup", k=k, ngram=ngram, cut=cut)  # type: ignore[arg-type]
    if ("layers" in values) == ("skip" in values):
        raise ConfigError(f"{head}: self needs exactly one of layers=N (the layers "
                          f"the draft runs) and skip=A-B (the block of layers it skips)")
    if "layers" in values:
        return DraftSpec("self", k=k, layers=_int(s, "layers", values["layers"], 1, None),
                         cut=cut)  # type: ignore[arg-type]
    m = re.fullmatch(r"(\d+)-(\d+)", values["skip"])
    if m is None or int(m.group(1)) > int(m.group(2)):
        raise ConfigError(f"{head}: skip must be a block of layers A-B with A <= B, "
                          f"got {values['skip']!r}")
    return DraftSpec("self", k=k, skip=(int(m.group(1)), int(m.group(2))),
                     cut=cut)  # type: ignore[arg-type]


__all__ = ["CUTS", "DEFAULT_K", "DEFAULT_NGRAM", "MAX_K", "METHODS", "TAIL_MAX", "DraftSpec",
           "parse_speculate"]
