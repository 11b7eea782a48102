"""What a model family's ``config.json`` mapping gives :mod:`models.hf`: a family with its own
mapping module (``models/hf_<family>.py``) describes itself with one
:class:`FamilyMapping`, and :data:`models.hf.MAPPINGS` lists it (one line)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FamilyMapping:
    """One ``model_type``'s import: its ``architectures`` name, what of a file it refuses
    (``unsupported(data)``: one entry per feature, named), the
    :class:`~models.config.ModelConfig` fields it sets beyond the common ones
    (``fields(data, where)``) and its configuration class's defaults of the common keys
    (``head_dim``, ...) where they differ from computing them."""

    model_type: str
    architecture: str
    unsupported: Callable[[dict[str, Any]], list[str]]
    fields: Callable[[dict[str, Any], str], dict[str, Any]]
    defaults: Mapping[str, Any]
