"""Functional mode: a request's tokens are the NPU's, computed by the integer pipeline on a
functional simulated device (the model compiled as ``kvsim generate`` compiles it).

A worker thread takes requests in the order they arrive and runs each one's prefill and
decode calls until its continuation ends (``max_tokens``, the end-of-sequence token, or the
server closing the stream after a stop sequence or a cancel), handing each token to the
request's stream as soon as it is computed. One cache serves one request at a time, so a
request's tokens wait for the requests before it: the server's schedule waits for them
(under ``--pace real`` it falls behind the clock and says so). The token's time is the
serving simulation's, not the single-request device's: the text is the NPU's, the schedule
the card's under load.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Sequence

import numpy as np

from models.bits import BitConfig
from models.quality import degenerate_logits
from models.source import ModelSource
from models.tokenizer import Tokenizer
from sim.app.quality import ready_for_text
from sim.app.server.text import Sampling, tokenizer_name
from sim.app.textgen import Sampler
from sim.device.hw import HardwareConfig


class NpuTextError(RuntimeError):
    """The integer pipeline's output for a request cannot be right (degenerate logits)."""


class NpuStream:
    """The tokens of one request, as the worker computes them."""

    def __init__(self, rid: int, prompt: Sequence[int], sampling: Sampling, seed: int,
                 loop: asyncio.AbstractEventLoop):
        self.rid = rid
        self.prompt = list(prompt)
        self.sampling = sampling
        self.seed = seed
        self.loop = loop
        self.tokens: asyncio.Queue[int | BaseException] = asyncio.Queue()
        self.closed = threading.Event()

    def put(self, item: int | BaseException) -> None:
        """(worker thread) A token, or the error that ends the stream."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.tokens.put_nowait, item)

    async def next(self) -> int:
        item = await self.tokens.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """No more tokens are wanted."""
        self.closed.set()


class NpuText:
    """The NPU's tokens for every request (see the module docstring)."""

    kind = "functional"

    def __init__(self, src: ModelSource, bits: BitConfig, *, kv: str, hw: HardwareConfig,
                 tokenizer: Tokenizer, max_len: int, weights_seed: int = 0, seed: int = 0):
        self.src = src
        self.tok = tokenizer
        self.seed = seed
        self.ready = ready_for_text(src, bits, kv=kv, hw=hw, tokens=max_len,
                                    seed=weights_seed)
        self.cm = self.ready.compiled
        self.model = self.ready.launch()
        self.jobs: queue.Queue[NpuStream | None] = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="kvsim-npu-text", daemon=True)
        self.thread.start()

    def describe(self) -> str:
        weights = "real weights" if self.src.real else "synthetic weights"
        return (f"functional mode: the NPU's tokens ({self.src.name}, {weights}, the integer "
                f"pipeline), tokenizer {tokenizer_name(self.tok)}")

    def open(self, rid: int, prompt: Sequence[int], sampling: Sampling) -> NpuStream:
        seed = sampling.seed if sampling.seed is not None else self.seed * 2**32 + rid
        stream = NpuStream(rid, prompt, sampling, seed % 2**64, asyncio.get_running_loop())
        self.jobs.put(stream)
        return stream

    def close(self) -> None:
        """Stop the worker after the request it is on (its stream is closed by then)."""
        self.jobs.put(None)
        self.thread.join()
        self.model.dispose()

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            if job.closed.is_set():
                continue
            try:
                self._generate(job)
            except Exception as err:  # the request fails; the worker goes on
                job.put(NpuTextError(f"request {job.rid}: {type(err).__name__}: {err}"))

    def _generate(self, job: NpuStream) -> None:
        s = job.sampling
        model, cm = self.model, self.cm
        cache, logits = 0, None
        for t0 in range(0, len(job.prompt), cm.max_seq):
            chunk = np.asarray(job.prompt[t0:t0 + cm.max_seq])
            [logits] = model.infer(self.ready.embed(chunk), cache_size=cache)
            cache += chunk.size
        pick = Sampler(s.temperature, job.seed).picker()
        stops = self.tok.stop_ids  # end of sequence or of the chat turn
        for k in range(s.max_tokens):
            if (why := degenerate_logits(logits)) is not None:
                raise NpuTextError(f"NPU logits of output token {k}: {why} (the integer "
                                   "pipeline's output cannot be right)")
            t = pick(logits)
            job.put(t)
            ended = t in stops and not s.ignore_eos and k + 1 >= s.min_tokens
            if ended or k + 1 == s.max_tokens or job.closed.is_set():
                return
            [logits] = model.infer(self.ready.embed([t]), cache_size=cache)
            cache += 1
