"""A stand-in model for the needle and eviction tests: it writes the pass key it was
shown. At each answer position its logits favour the token that followed " The pass key
is" the first time (the needle), if that token is still in its cache and is not the
question's own. It counts the tokens it is fed and evicts by the policies' kept
positions, so the runners' bookkeeping can be tested without a model run."""

from __future__ import annotations

import numpy as np

from sim.app.evict import keep_positions

VOCAB = 49152  # SmolLM2's


class EchoRunner:
    fed = 0  # tokens fed over every instance of this process (reset by the test)
    pattern: list[int] = []  # the needle's lead-in tokens (set by the test, or below)
    chunk = 1  # tokens per call: its results do not depend on where calls begin

    def __init__(self, *args, **kw):
        self.ids: list[int] = []
        self.size = 0
        if not EchoRunner.pattern:  # a pool's process: SmolLM2's tokens of the lead-in
            from models.source import resolve_model

            EchoRunner.pattern = resolve_model("smollm2-135m").tokenizer().encode(
                " The pass key is")

    def feed(self, ids, *, rows=0):
        EchoRunner.fed += len(ids)
        self.ids = [*self.ids, *ids]
        if not rows:
            return None
        p = self.pattern
        at = next((i + len(p) for i in range(len(self.ids))
                   if self.ids[i:i + len(p)] == p), None)
        logits = np.zeros((rows, VOCAB), np.float32)
        if at is not None and len(self.ids) - at > rows:
            logits[np.arange(rows), self.ids[at:at + rows]] = 5.0
        return logits

    def snapshot(self):
        return list(self.ids)

    def restore(self, snap):
        self.ids = list(snap)

    def evict(self, policy, budget, side):
        keep = keep_positions(policy, len(self.ids), budget, np.ones(len(self.ids)))
        self.ids = [self.ids[i] for i in keep]
        return None, keep

    def disarm(self):
        pass

    def close(self):
        pass


def make_echo(src, cfg, bits, hw, context, seed) -> EchoRunner:
    """``run_grid``'s ``make_runner``: an :class:`EchoRunner` for every group (a
    top-level function: a process pool's workers import it)."""
    return EchoRunner()
