"""Names and spec strings of KV formats: the registry of formats named in FACTS.md, and
the text programs put in their format table.

Programs name formats by text (:func:`parse` / :func:`to_text`): a registered name
(``"int8"``, ``"kivi-4.k"``) or a compact spec
``"b4.channel.g32.asym.scale-fp16.zero-fp16.fp-fp16.window128"``
(:meth:`~isa.kv.format.KVFormat.spec`). :func:`pair` gives the (K, V) formats of a layout
name (``kivi-4`` has different K and V formats).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import FormatError
from .format import KVFormat

#: Longest number a spec token may carry (digits): larger ones are refused, not parsed.
MAX_SPEC_DIGITS = 9


class KVPair(NamedTuple):
    """The formats of a layer's K and V caches (the same object for an MLA latent cache)."""

    k: KVFormat
    v: KVFormat


def _named(name: str, **kw) -> KVFormat:
    return KVFormat(name=name, **kw)


def _kivi(bits: int, role: str) -> KVFormat:
    # KIVI (Liu et al. 2024; FACTS.md): asymmetric, fp16 scale and zero, G=32, R=128 fp16;
    # keys per-channel (groups of G tokens), values per-token (groups of G channels).
    axis = "channel" if role == "k" else "token"
    return _named(f"kivi-{bits}.{role}", bits=bits, axis=axis, group=32, scale_dtype="fp16",
                  zero_dtype="fp16", fp_dtype="fp16", window=128)


def _quantmla(content_bits: int) -> KVFormat:
    # QuantMLA (FACTS.md): per-token asymmetric, G=64, fp16 scale, uint8 zero, records padded
    # to 16 bytes, first 4 and last 128 tokens BF16; content and RoPE parts quantized apart.
    return _named(f"quantmla-c{content_bits}r4", bits=content_bits, axis="token", group=64,
                  scale_dtype="fp16", zero_dtype="uint8", fp_dtype="bf16", window=128,
                  sink=4, pad=16, rope_width=64, rope_bits=4)


#: Single-cache formats by name.
FORMATS: dict[str, KVFormat] = {
    f.name: f
    for f in (
        _named("bf16", bits=16, fp_dtype="bf16"),
        _named("fp16", bits=16, fp_dtype="fp16"),
        # The device's native int8 cache: the int8 values as written (1 byte each).
        _named("int8", bits=8, axis="none"),
        _kivi(2, "k"),
        _kivi(2, "v"),
        _kivi(4, "k"),
        _kivi(4, "v"),
        # QServe KV4 (Lin et al. 2024; FACTS.md): uint4 codes, fp16 scale and zero per token
        # per head, pages of 64 tokens. group=64 is "per head" for head_dim 64 (Qwen2.5-0.5B,
        # Llama-3.2-1B); QServe's own 8B models have head_dim 128 (spec ...g128...).
        _named("qserve-kv4", bits=4, axis="token", group=64, scale_dtype="fp16",
               zero_dtype="fp16", page=64),
        _quantmla(4),
        _quantmla(2),
    )
}

#: (K, V) layouts by name.
PAIRS: dict[str, KVPair] = {
    "bf16": KVPair(FORMATS["bf16"], FORMATS["bf16"]),
    "fp16": KVPair(FORMATS["fp16"], FORMATS["fp16"]),
    "int8": KVPair(FORMATS["int8"], FORMATS["int8"]),
    "kivi-2": KVPair(FORMATS["kivi-2.k"], FORMATS["kivi-2.v"]),
    "kivi-4": KVPair(FORMATS["kivi-4.k"], FORMATS["kivi-4.v"]),
    "qserve-kv4": KVPair(FORMATS["qserve-kv4"], FORMATS["qserve-kv4"]),
    "quantmla-c4r4": KVPair(FORMATS["quantmla-c4r4"], FORMATS["quantmla-c4r4"]),
    "quantmla-c2r4": KVPair(FORMATS["quantmla-c2r4"], FORMATS["quantmla-c2r4"]),
    # per-token keys and values at 4 and 2 bits, both in KIVI's value format (G=32,
    # asymmetric, fp16 scale and zero, R=128 fp16): the per-token-key baseline that KIVI
    # compares its per-channel keys against
    "tok4": KVPair(FORMATS["kivi-4.v"], FORMATS["kivi-4.v"]),
    "tok2": KVPair(FORMATS["kivi-2.v"], FORMATS["kivi-2.v"]),
}

_BY_VALUE = {f: name for name, f in FORMATS.items()}

_SPEC_TOKENS = (
    (re.compile(r"b(\d+)$"), "bits"),
    (re.compile(r"(token|channel|none)$"), "axis"),
    (re.compile(r"g(\d+)$"), "group"),
    (re.compile(r"(sym|asym)$"), "symmetric"),
    (re.compile(r"scale-(\w+)$"), "scale_dtype"),
    (re.compile(r"zero-(\w+)$"), "zero_dtype"),
    (re.compile(r"fp-(\w+)$"), "fp_dtype"),
    (re.compile(r"window(\d+)$"), "window"),
    (re.compile(r"sink(\d+)$"), "sink"),
    (re.compile(r"pad(\d+)$"), "pad"),
    (re.compile(r"page(\d+)$"), "page"),
    (re.compile(r"rope(\d+)b(\d+)$"), "rope"),
    (re.compile(r"ring(\d+)$"), "ring"),
    (re.compile(r"slide(\d+)$"), "slide"),
)
SPEC_HELP = ("a spec like 'b4.channel.g32.asym.scale-fp16.zero-fp16.fp-fp16.window128' "
             "(tokens: b16|b8|b4|b2, token|channel|none, g<N>, sym|asym, scale-<fp16|bf16>, "
             "zero-<fp16|bf16|uint8|int8>, fp-<bf16|fp16>, window<N>, sink<N>, pad<N>, "
             "page<N>, rope<N>b<M>, ring<N>, slide<N>)")


def names() -> list[str]:
    """Every name :func:`parse` accepts besides specs (single formats and pair names)."""
    return sorted(set(FORMATS) | set(PAIRS))


def _match_token(text: str, tok: str) -> tuple[str, re.Match]:
    for pattern, key in _SPEC_TOKENS:
        m = pattern.match(tok)
        if m:
            return key, m
    raise FormatError(f"KV format spec {text!r}: unknown token {tok!r}; expected {SPEC_HELP}")


def _fields(f: KVFormat) -> dict:
    return {k: getattr(f, k) for k in f.__dataclass_fields__ if k != "name"}


def _parse_spec(text: str) -> KVFormat:
    kw: dict = {}
    for tok in text.split("."):
        key, m = _match_token(text, tok)
        if key in kw or (key == "rope" and "rope_width" in kw):
            raise FormatError(f"KV format spec {text!r}: {key} given twice")
        if any(len(g) > MAX_SPEC_DIGITS for g in m.groups() if g and g.isdigit()):
            raise FormatError(f"KV format spec {text[:40]!r}...: number too large "
                              f"({max(len(g) for g in m.groups() if g)} digits)")
        if key == "rope":
            kw["rope_width"] = int(m.group(1))
            kw["rope_bits"] = int(m.group(2))
        elif key == "symmetric":
            kw[key] = m.group(1) == "sym"
        elif key in ("axis", "scale_dtype", "zero_dtype", "fp_dtype"):
            kw[key] = m.group(1)
        else:
            kw[key] = int(m.group(1))
    if "bits" not in kw:
        raise FormatError(f"KV format spec {text!r}: the bit width (b16|b8|b4|b2) is missing")
    f = KVFormat(**kw)
    return KVFormat(**{**_fields(f), "name": _BY_VALUE.get(f, "")})


def parse(text: str, role: str | None = None) -> KVFormat:
    """The format a program's format table names: a registered name (``"int8"``,
    ``"kivi-4.k"``), a pair name with ``role`` ``"k"``/``"v"`` (``parse("kivi-4", "k")``),
    or a spec string (:meth:`KVFormat.spec`). Unknown names raise :class:`FormatError`
    listing the valid ones."""
    if not isinstance(text, str):
        raise FormatError(f"a KV format is named by a string, got {type(text).__name__}")
    t = text.strip()
    if t in FORMATS:
        return FORMATS[t]
    if t.endswith((".k", ".v")) and t[:-2] in PAIRS:
        role, t = t[-1], t[:-2]
    if t in PAIRS:
        p = PAIRS[t]
        if p.k == p.v:
            return p.k
        if role not in ("k", "v"):
            raise FormatError(f"KV layout {t!r} has different K and V formats: name "
                              f"{t + '.k'!r} or {t + '.v'!r}")
        return p.k if role == "k" else p.v
    if re.match(r"b\d+(\.|$)", t):
        return _parse_spec(t)
    raise FormatError(f"unknown KV format {text!r}; valid names: {', '.join(names())}; "
                      f"or {SPEC_HELP}")


def to_text(fmt: KVFormat) -> str:
    """Text for a program's format table: the registry name, else the spec string;
    ``parse(to_text(f)) == f``."""
    return _BY_VALUE.get(fmt) or fmt.spec()


def pair(name: str) -> KVPair:
    """The (K, V) formats of a layout name (any single-format name or spec gives (f, f))."""
    if name in PAIRS:
        return PAIRS[name]
    f = parse(name)
    return KVPair(f, f)
