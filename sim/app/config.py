"""Run configuration: a TOML file (or the embedded default) plus ``--set a.b=c`` overrides,
validated into a frozen :class:`RunConfig`. Unknown keys are errors, and every error
names the field path at fault.

``[hardware]`` takes ``preset`` plus any hardware field as an override, e.g.::

    [hardware]
    preset = "aries"
    dram.efficiency = 0.7
"""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, StrictInt, ValidationError, model_validator

from isa import kvformats
from kvsim.errors import ConfigError, KvsimError
from models.bits import (
    BitConfig,
    KvReadPath,
    NumericsOptions,
    WeightBits,
    build_numerics,
    preset_with_overrides,
)
from models.schema import Frozen, validation_message
from sim.app.spec_config import SpeculateSection, check_speculate
from sim.device.hw import HardwareConfig, preset_dict, set_dotted

DEFAULT_CONFIG_TOML = """
# The embedded default scenario of `kvsim run`: Qwen2.5-0.5B (synthetic weights, INT8
# weights and INT8 KV cache) on the ARIES preset: prefill a 240-token prompt, then decode
# 8 tokens, every call through the host runtime (embeddings in and logits out over PCIe).
[hardware]
preset = "aries"

[model]
preset = "qwen2.5-0.5b"

[bits]
preset = "W8"

[kv]
format = "int8"

[workload]
kind = "generate"
prompt_tokens = 240
output_tokens = 8
seed = 0

[sim]
fidelity = "timing"

[outputs]
trace = "ops"
"""

class _Section(Frozen):
    pass


class ModelSection(_Section):
    """A model preset or a Hugging Face ``config.json`` (exactly one)."""

    preset: str | None = None
    hf_config: str | None = None
    weights_seed: int = Field(0, ge=0, description="seed of the synthetic weights")
    safetensors: str | None = Field(None, description="real weights (file or folder)")

    @model_validator(mode="after")
    def _one(self) -> ModelSection:
        if (self.preset is None) == (self.hf_config is None):
            raise ValueError("give exactly one of 'preset' and 'hf_config'")
        return self


class BitsSection(_Section):
    """Weight bits: a preset (``W8``, ``W4V8``) and optional per-projection overrides."""

    preset: str = "W8"
    weights: dict[str, StrictInt] = Field(default_factory=dict)
    numerics: dict[str, str] = Field(default_factory=dict, description="[bits.numerics]: "
                                     "a numerics preset and/or residual, act_scale, ...")

    @property
    def label(self) -> str:
        """The preset, with the overrides when there are any (``W8+ffn=4``)."""
        return "+".join([self.preset, *(f"{k}={v}" for k, v in self.weights.items())])

    def weight_bits(self) -> WeightBits:
        """The preset with the per-projection overrides applied."""
        return preset_with_overrides(self.preset, self.weights, where="bits")

    @model_validator(mode="after")
    def _numerics_valid(self) -> BitsSection:
        self.numerics_options()  # a ConfigError naming bits.numerics.<field>
        self.bit_config()  # weights and numerics together (a group needs 4-bit weights)
        return self

    def numerics_options(self) -> NumericsOptions:
        """``[bits.numerics]`` validated (errors name ``bits.numerics.<field>``)."""
        return build_numerics(self.numerics)

    def bit_config(self, kv: KvSection | None = None) -> BitConfig:
        """The compiler's :class:`BitConfig`: weights, numerics and the KV read path."""
        return BitConfig(weights=self.weight_bits(), numerics=self.numerics_options(),
                         kv_read=kv.read if kv is not None else "integer")


class KvSection(_Section):
    format: str = "int8"
    read: KvReadPath = Field("integer", description="how attention reads the cache: "
                             "integer codes (ARIES) or dequantized to fp16")


class CompileSection(_Section):
    core_mode: Literal["single", "global4", "global8"] = "global8"
    max_sequence_length: int = Field(512, ge=1, description="most tokens per infer call")
    cache_length: int | None = Field(None, ge=1, description="KV capacity in tokens; "
                                     "default: prompt + output rounded up to 256")
    cache_slots: int = Field(1, ge=1)
    tile_bytes: int | None = Field(None, ge=64)


class CacheOp(_Section):
    """One scheduled operation on the KV cache of a ``generate`` workload
    (``[[workload.cache_ops]]``), run between two runtime calls.

    - ``at_token``: the op runs when the sequence holds this many tokens: after the prefill
      (``at_token = prompt_tokens``) or after a decode step (up to ``prompt_tokens +
      output_tokens - 1``). Ops run in the listed order, which must not go back in time.
    - ``op``: ``"evict"`` (remove tokens), ``"requantize"`` (pass every cached value
      through ``format`` and back) or ``"dump_load"`` (dump every cache to the host and
      load it back unchanged: a snapshot and restore).
    - ``where``: ``"host"`` (dump over the host link, edit on the host, load back) or
      ``"device"`` (a DRAM-only program on the card; not for ``dump_load``).
    - evict ``policy``: ``"window"`` keeps the first ``sinks`` and the last ``recent``
      tokens (StreamingLLM); ``"key_norm"`` also keeps the ``budget`` tokens between them
      whose keys have the largest norms (H2O-style; scored on the host, so host only);
      ``"positions"`` drops the token positions listed in ``drop``.

    Example: at token 1024, dump, evict on the host keeping 4 sinks and 508 recent tokens,
    load back::

        [[workload.cache_ops]]
        at_token = 1024
        op = "evict"
        where = "host"
        policy = "window"
        sinks = 4
        recent = 508
    """

    at_token: int = Field(ge=1, description="sequence length (tokens) when the op runs")
    op: Literal["evict", "requantize", "dump_load"]
    where: Literal["host", "device"] = "host"
    policy: Literal["window", "key_norm", "positions"] | None = None
    sinks: int | None = Field(None, ge=0, description="evict: first tokens always kept")
    recent: int | None = Field(None, ge=0, description="evict: last tokens always kept")
    budget: int | None = Field(None, ge=0, description="evict key_norm: tokens kept by score")
    drop: list[int] | None = Field(None, description="evict positions: positions to drop")
    format: str | None = Field(None, description="requantize: the KV format values pass "
                               "through")


#: Fields of a cache op that only some ops or policies take: field -> who takes it.
_CACHE_OP_FIELDS = {
    "policy": ("evict", None),
    "sinks": ("evict", ("window", "key_norm")),
    "recent": ("evict", ("window", "key_norm")),
    "budget": ("evict", ("key_norm",)),
    "drop": ("evict", ("positions",)),
    "format": ("requantize", None),
}


class WorkloadConfig(_Section):
    kind: Literal["generate", "gemv"] = "generate"
    # generate: prefill then decode through the runtime
    context_tokens: int = Field(0, ge=0, description=(
        "tokens already in the KV cache before the prompt (a context whose prefill is not "
        "simulated): timing-only runs start from a cache of this length; functional runs "
        "fill it with the device's own prefill of random tokens, not counted in the "
        "metrics"))
    prompt_tokens: int = Field(240, ge=1)
    prompt: str | None = Field(None, description="a prompt text (a model with a tokenizer): "
                               "its tokens are the prompt, and prompt_tokens their count")
    chat: bool = Field(False, description="wrap prompt in the model's chat template")
    output_tokens: int = Field(16, ge=0)
    seed: int = Field(0, ge=0)
    cache_ops: list[CacheOp] = Field(default_factory=list, description="scheduled KV-cache "
                                     "operations (generate only)")
    # gemv: the hand-written demo layer (one GEMV with double-buffered weight streaming)
    k: int = Field(2048, ge=2, description="gemv: input features")
    n: int = Field(8192, ge=1, description="gemv: output features (rows of W)")
    w_bits: Literal[4, 8] = 8
    tile_bytes: int | None = Field(None, ge=64, description="gemv: weight tile bytes")

    @model_validator(mode="after")
    def _packing(self) -> WorkloadConfig:
        if self.w_bits == 4 and self.k % 2:
            raise ValueError(f"k must be even for 4-bit packed weights, got {self.k}")
        return self


class SimConfig(_Section):
    fidelity: Literal["functional", "timing"] = "timing"
    allow_degenerate: bool = Field(False, description="a functional run of real weights "
                                   "whose logits are degenerate (all-zero, constant, NaN) or "
                                   "whose text is stuck on one token goes on (reported) "
                                   "instead of failing")


class OutputsConfig(_Section):
    trace: Literal["off", "ops", "tiles"] = "ops"
    max_trace_events: int = Field(2_000_000, ge=0)
    counter_bins: int = Field(200, ge=1)


class ModelOnHardware(_Section):
    """The sections every kvsim config starts with (runs and serving)."""

    hardware: HardwareConfig
    model: ModelSection = ModelSection(preset="qwen2.5-0.5b")
    bits: BitsSection = BitsSection()
    kv: KvSection = KvSection()

    def resolved(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class RunConfig(ModelOnHardware):
    compile: CompileSection = CompileSection()
    workload: WorkloadConfig = WorkloadConfig()
    sim: SimConfig = SimConfig()
    outputs: OutputsConfig = OutputsConfig()
    speculate: SpeculateSection | None = None


def parse_value(text: str) -> Any:
    """A ``--set`` value as TOML (numbers, booleans, strings, arrays); bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


_INDEXED = re.compile(r"([^.\[\]]+)((?:\[\d+\])*)")


def _set_indexed(tree: dict[str, Any], key: str, value: Any) -> None:
    """``set_dotted`` for keys with list indices, e.g. ``workload.cache_ops[0].at_token``."""
    steps: list[str | int] = []
    for part in key.split("."):
        m = _INDEXED.fullmatch(part)
        if m is None:
            raise ConfigError(f"{key}: bad key")
        steps.append(m.group(1))
        steps.extend(int(i) for i in re.findall(r"\d+", m.group(2)))
    node: Any = tree
    walked = ""
    for step, nxt in zip(steps, steps[1:], strict=False):
        if isinstance(step, int):
            if not isinstance(node, list) or not 0 <= step < len(node):
                size = len(node) if isinstance(node, list) else 0
                raise ConfigError(f"{walked}[{step}]: no such entry ({walked} has {size})")
            walked += f"[{step}]"
            node = node[step]
        else:
            if not isinstance(node, dict):
                raise ConfigError(f"{walked}: is a value, not a table; cannot set {key}")
            walked = f"{walked}.{step}" if walked else step
            if step not in node:
                node[step] = [] if isinstance(nxt, int) else {}
            node = node[step]
    last = steps[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or not 0 <= last < len(node):
            size = len(node) if isinstance(node, list) else 0
            raise ConfigError(f"{walked}[{last}]: no such entry ({walked} has {size})")
        node[last] = value
    elif not isinstance(node, dict):
        raise ConfigError(f"{walked}: is a value, not a table; cannot set {key}")
    else:
        node[last] = value


def set_field(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set one config field in a config tree, as ``--set key=value`` does (``key`` dotted,
    list entries by index: ``workload.cache_ops[0].at_token``)."""
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"{key!r}: bad key")
    if "[" in key or "]" in key:
        _set_indexed(tree, key, value)
    else:
        set_dotted(tree, key, value)
    # a model is named one way: setting one way replaces the other
    other = {"model.preset": "hf_config", "model.hf_config": "preset"}.get(key)
    if other and isinstance(tree.get("model"), dict):
        tree["model"].pop(other, None)


def split_assignment(item: str, flag: str, expected: str = "key=value") -> tuple[str, Any]:
    """``a.b=value`` (of ``--set`` / ``--axis``) -> ``("a.b", parsed value)``."""
    if "=" not in item:
        raise ConfigError(f"{flag} {item!r}: expected {expected}")
    key, _, value = item.partition("=")
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"{flag} {item!r}: bad key {key!r}")
    return key, parse_value(value.strip())


def apply_sets(tree: dict[str, Any], sets: list[str]) -> None:
    for item in sets:
        set_field(tree, *split_assignment(item, "--set"))


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(_flatten(v, path))
        else:
            out[path] = v
    return out


def resolve_hardware(section: Any) -> dict[str, Any]:
    """``{"preset": name, ...overrides}`` -> the full hardware dict."""
    if not isinstance(section, dict):
        raise ConfigError("hardware: must be a table with a 'preset' key")
    section = dict(section)
    name = section.pop("preset", "aries")
    if not isinstance(name, str):
        raise ConfigError("hardware.preset: must be a string")
    data = copy.deepcopy(preset_dict(name))
    for key, value in _flatten(section).items():
        set_dotted(data, key, value, root="hardware")
    return data


def load_tree(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return tomllib.loads(DEFAULT_CONFIG_TOML)
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a folder")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{p}: not valid TOML: {err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a UTF-8 text file") from None
    except OSError as err:
        raise ConfigError(f"{p}: cannot be read ({err.strerror or err})") from None


def _cache_op_fields(op: CacheOp, where: str) -> None:
    """A field given to an op or policy that does not take it is an error."""
    for name, (takes_op, takes_policy) in _CACHE_OP_FIELDS.items():
        if getattr(op, name) is None:
            continue
        if op.op != takes_op:
            raise ConfigError(f"{where}.{name}: only op = {takes_op!r} takes it "
                              f"(this op is {op.op!r})")
        if takes_policy is not None and op.policy not in takes_policy:
            raise ConfigError(f"{where}.{name}: only policy = "
                              f"{' or '.join(repr(p) for p in takes_policy)} takes it "
                              f"(this policy is {op.policy!r})")


def _evicted(op: CacheOp, cache: int, where: str) -> int:
    """Tokens an evict op removes from a cache of ``cache`` tokens (validating it)."""
    if op.policy is None:
        raise ConfigError(f"{where}.policy: op 'evict' needs a policy: 'window', "
                          "'key_norm' or 'positions'")
    if op.policy == "positions":
        if not op.drop:
            raise ConfigError(f"{where}.drop: policy 'positions' needs a non-empty list of "
                              "token positions")
        for j, p in enumerate(op.drop):
            if not 0 <= p < cache:
                raise ConfigError(f"{where}.drop[{j}]: position {p} is outside the cache "
                                  f"(0..{cache - 1} at this point)")
        if len(set(op.drop)) != len(op.drop):
            raise ConfigError(f"{where}.drop: lists a position twice")
        return len(op.drop)
    if op.policy == "key_norm" and op.where == "device":
        raise ConfigError(f"{where}.where: policy 'key_norm' scores keys on the host; "
                          "use where = 'host'")
    for name in ("sinks", "recent") + (("budget",) if op.policy == "key_norm" else ()):
        if getattr(op, name) is None:
            raise ConfigError(f"{where}.{name}: policy {op.policy!r} needs it")
    kept = op.sinks + op.recent + (op.budget or 0)
    if kept >= cache:
        raise ConfigError(f"{where}.recent: keeping {kept} tokens (sinks + recent"
                          f"{' + budget' if op.policy == 'key_norm' else ''}) of a cache of "
                          f"{cache} tokens evicts nothing")
    return cache - kept


def check_cache_ops(w: WorkloadConfig) -> None:
    """Cross-field checks of ``workload.cache_ops`` (each error names the op's field):
    when each op runs, what it takes, and that each evict leaves something to evict in the
    cache as the earlier ops left it."""
    if not w.cache_ops:
        return
    if w.kind != "generate":
        raise ConfigError(f"workload.cache_ops: only a 'generate' workload has a KV cache "
                          f"(kind is {w.kind!r})")
    first = w.context_tokens + w.prompt_tokens
    last = first + max(w.output_tokens - 1, 0)
    removed = 0
    previous = first
    for i, op in enumerate(w.cache_ops):
        where = f"workload.cache_ops[{i}]"
        if op.at_token < first:
            raise ConfigError(f"{where}.at_token: {op.at_token} is inside the prefill; an op "
                              f"runs after it (at_token >= context_tokens + prompt_tokens = "
                              f"{first})")
        if op.at_token > last:
            raise ConfigError(f"{where}.at_token: {op.at_token} is past the last token: the "
                              f"sequence ends at {last} tokens (context_tokens "
                              f"{w.context_tokens} + prompt_tokens {w.prompt_tokens}"
                              f" + output_tokens {w.output_tokens} - 1)")
        if op.at_token < previous:
            raise ConfigError(f"{where}.at_token: {op.at_token} comes before the previous "
                              f"op's {previous}; list the ops in the order they run")
        previous = op.at_token
        _cache_op_fields(op, where)
        if op.op == "dump_load" and op.where == "device":
            raise ConfigError(f"{where}.where: 'dump_load' moves the cache to the host and "
                              "back; use where = 'host'")
        if op.op == "requantize":
            if op.format is None:
                raise ConfigError(f"{where}.format: op 'requantize' needs a KV format")
            try:
                kvformats.parse(op.format)
            except KvsimError as err:
                raise ConfigError(f"{where}.format: {err}") from None
        if op.op == "evict":
            removed += _evicted(op, op.at_token - removed, where)


def _paths(message: str) -> str:
    """``workload.cache_ops.0.op`` -> ``workload.cache_ops[0].op`` in pydantic's paths."""
    out = []
    for item in message.split("; "):
        path, sep, rest = item.partition(": ")
        out.append(re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", path) + sep + rest)
    return "; ".join(out)


def build_run_config(tree: dict[str, Any]) -> RunConfig:
    tree = copy.deepcopy(tree)
    tree["hardware"] = resolve_hardware(tree.get("hardware", {"preset": "aries"}))
    try:
        cfg = RunConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_paths(validation_message(err))) from None
    check_cache_ops(cfg.workload)
    check_speculate(cfg)
    return cfg


def load_run_config(path: str | Path | None = None, sets: list[str] | None = None) -> RunConfig:
    """The embedded default (``path=None``) or a TOML file, with ``--set`` overrides."""
    tree = load_tree(path)
    apply_sets(tree, sets or [])
    return build_run_config(tree)


#: A run's default cache capacity is its prompt + output tokens rounded up to this (tokens).
CACHE_LENGTH_ROUND = 256


def cache_length(cfg: RunConfig) -> int:
    """The KV capacity a run compiles: ``compile.cache_length``, or context + prompt +
    output tokens rounded up to :data:`CACHE_LENGTH_ROUND`."""
    w = cfg.workload
    tokens = w.context_tokens + w.prompt_tokens + w.output_tokens
    return cfg.compile.cache_length or -(-tokens // CACHE_LENGTH_ROUND) * CACHE_LENGTH_ROUND
