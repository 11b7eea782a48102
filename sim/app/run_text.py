"""The text side of a generate run: a prompt given as text (``workload.prompt``, tokenized
with the model's tokenizer), the generated text, the float reference's continuation beside
it, and the degenerate-output guard of a functional run of real weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvsim.errors import ConfigError, KvsimError
from models.quality import DegenerateOutput, collapsed, degenerate_logits
from models.source import ModelSource
from sim.app.config import RunConfig, check_cache_ops
from traces.results import TextFigures


def with_prompt(cfg: RunConfig, src: ModelSource) -> tuple[RunConfig, list[int] | None, Any]:
    """``cfg`` with ``workload.prompt_tokens`` set to the prompt text's token count, the
    tokens and the tokenizer of its model ``src``; without ``workload.prompt``: ``(cfg,
    None, None)``."""
    w = cfg.workload
    if w.prompt is None:
        return cfg, None, None
    if not src.real:
        raise ConfigError("workload.prompt: the model has synthetic weights and no tokenizer; "
                          "use a real model (smollm2-135m, a GGUF file or a Hugging Face "
                          "folder) or workload.prompt_tokens")
    tok = src.tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": w.prompt}]) if w.chat \
        else w.prompt
    ids = tok.encode(text)
    if not ids:
        raise ConfigError("workload.prompt: the text has no tokens")
    new = cfg.model_copy(update={"workload": w.model_copy(update={"prompt_tokens": len(ids)})})
    check_cache_ops(new.workload)
    return new, ids, tok


@dataclass
class Guard:
    """The degenerate-output guard of a run: active for functional runs of real weights;
    a degenerate output raises :class:`DegenerateOutput` unless ``sim.allow_degenerate``
    (then it is recorded in ``found``)."""

    active: bool
    allow: bool
    found: list[str] = field(default_factory=list)

    @classmethod
    def for_run(cls, cfg: RunConfig, real: bool) -> Guard:
        return cls(active=real and cfg.sim.fidelity == "functional",
                   allow=cfg.sim.allow_degenerate)

    def _report(self, what: str) -> None:
        if not self.allow:
            raise DegenerateOutput(f"{what} (the integer pipeline's output cannot be right; "
                                   f"set sim.allow_degenerate = true to go on)")
        self.found.append(what)

    def logits(self, logits: np.ndarray | None, where: str) -> None:
        if self.active and logits is not None and (why := degenerate_logits(logits)):
            self._report(f"NPU logits of {where}: {why}")

    def text(self, tokens: list[int], reference: list[int]) -> None:
        if self.active and (why := collapsed(tokens, reference)):
            self._report(f"NPU text: {why}")


def text_figures(cfg: RunConfig, src: ModelSource, ids: list[int] | None, tok: Any,
                 generated: list[int], guard: Guard) -> TextFigures:
    """The ``text`` entry of a run's metrics (its model ``src``): the prompt, the generated
    text and, for a functional run of real weights, the float reference's greedy
    continuation and where the two first differ (the guard checks the text against it)."""
    from sim.app.textgen import Sampler, first_difference, reference_continuation

    if tok is None and src.real:
        try:
            tok = src.tokenizer()
        except KvsimError:  # real weights without a tokenizer (e.g. a bare GGUF): no text
            tok = None
    reference_text, first = None, None
    compared = False
    if guard.active and ids is not None and tok is not None and generated:
        ref = reference_continuation(src, ids, len(generated), Sampler(), tok.stop_ids,
                                     seed=cfg.model.weights_seed)
        if ref:
            compared = True
            # the texts end at the first end-of-sequence or end-of-turn token (not shown)
            reference_text, first = tok.continuation_text(ref), first_difference(generated, ref)
            guard.text(generated, ref)
    return TextFigures(prompt=cfg.workload.prompt,
                       generated_text=tok.continuation_text(generated) if tok else None,
                       reference_compared=compared, reference_text=reference_text,
                       first_difference_token=first,
                       degenerate="; ".join(guard.found) or None)


__all__ = ["Guard", "text_figures", "with_prompt"]
