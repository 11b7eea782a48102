"""The config of ``kvsim serve --http``: a serving config (``[hardware]``, ``[model]``,
``[bits]``, ``[kv]``, ``[compile]``, ``[serving]``; the workload is the clients') plus a
``[server]`` section: where to listen, how tokens are paced, where their text comes from.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from kvsim.errors import ConfigError
from models.schema import Frozen, validation_message
from sim.app.config import apply_sets, load_tree, resolve_hardware
from sim.app.serve.config import ServeConfig

#: Longest sequence (prompt + output tokens) served when ``serving.max_model_len`` is not
#: set, if the model allows that many (an assumption of this server: the step cost grid and
#: the compiled buffers grow with it; vLLM's default is the model's whole context).
DEFAULT_MAX_MODEL_LEN = 4096


class ServerSection(Frozen):
    """Where the server listens and how it emits tokens."""

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port (0: any free port)")
    pace: Literal["real", "none"] = Field(
        "real", description="real: each token leaves at its simulated time (x time_scale) "
        "on the wall clock; none: as fast as the simulator goes, simulated times in the "
        "chunks")
    time_scale: float = Field(1.0, gt=0, le=1e6, description="wall seconds per simulated "
                              "second (pace real)")
    fidelity: Literal["timing", "functional"] = Field(
        "timing", description="timing: output tokens drawn from the tokenizer's vocabulary; "
        "functional: the NPU's tokens (the integer pipeline on the simulated device)")
    tokenizer: str | None = Field(None, description="a GGUF file, Hugging Face folder, "
                                  "'smollm2-135m' or 'bytes'; default: the model's own, "
                                  "else the embedded model's (timing), else 'bytes'")
    served_model_name: str | None = Field(None, description="the model id clients ask for "
                                          "(default: the model's name)")
    seed: int = Field(0, ge=0, description="seed of the timing mode's tokens")
    lag_tolerance_s: float = Field(0.005, ge=0, description="pace real: a step's tokens "
                                   "sent later than this after their time are 'behind'")
    shutdown_grace_s: float = Field(30.0, ge=0, description="on SIGINT/SIGTERM, how long "
                                    "requests in flight may take to finish before they "
                                    "are cancelled")
    max_body_bytes: int = Field(16 * 2**20, ge=1024, description="largest request body")


class HttpServeConfig(ServeConfig):
    server: ServerSection = ServerSection()

    def max_model_len(self, model_context: int) -> int:
        """Longest sequence served: ``serving.max_model_len``, else the model's context up
        to :data:`DEFAULT_MAX_MODEL_LEN`."""
        n = self.serving.max_model_len
        return n if n is not None else min(model_context, DEFAULT_MAX_MODEL_LEN)


DEFAULT_HTTP_TOML = """
# kvsim serve --http without a config: the embedded real model (SmolLM2-135M-Instruct,
# its own tokenizer) on one ARIES chip, W8 weights with the w8 numerics, int8 KV cache.
[hardware]
preset = "aries"
[model]
preset = "smollm2-135m"
[bits]
preset = "W8"
[bits.numerics]
preset = "w8"
[kv]
format = "int8"
[serving]
max_num_seqs = 64
max_num_batched_tokens = 2048
"""


def load_http_config(path: str | Path | None = None,
                     sets: list[str] | None = None) -> HttpServeConfig:
    """A server config from ``path`` (TOML; None: the embedded default) and overrides."""
    tree = tomllib.loads(DEFAULT_HTTP_TOML) if path is None else load_tree(path)
    apply_sets(tree, sets or [])
    return build_http_config(tree)


def build_http_config(tree: dict[str, Any]) -> HttpServeConfig:
    tree = copy.deepcopy(tree)
    tree["hardware"] = resolve_hardware(tree.get("hardware", {"preset": "aries"}))
    try:
        return HttpServeConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(validation_message(err)) from None
