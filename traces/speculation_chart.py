"""The run report's chart of speculative decoding (:mod:`traces.report`'s ``RUN_CHARTS``):
each round's draft, verification and tail-cut time."""

from __future__ import annotations

import plotly.graph_objects as go

from .page import Figure, layout
from .recorder import Recorder
from .results import GenerateMetrics, RunMetrics

#: Colours of speculative decoding's phases (the run report's timeline uses them too).
SPECULATION_COLORS = {"draft": "#bcbd22", "verify": "#2ca02c", "tail_cut": "#d62728"}


def _speculation(metrics: RunMetrics) -> go.Figure | None:
    """Each speculative round's time (draft, verify, tail cut; stacked), with its
    drafted and accepted tokens on hover."""
    sp = metrics.speculation if isinstance(metrics, GenerateMetrics) else None
    if sp is None or not sp.rounds:
        return None
    rounds = sp.rounds
    x = [r.step for r in rounds]
    tokens = [[r.drafted, r.accepted] for r in rounds]
    fig = go.Figure([go.Bar(name=name, x=x, y=[getattr(r, key) * 1e3 for r in rounds],
                            marker={"color": SPECULATION_COLORS[phase]}, customdata=tokens,
                            hovertemplate=f"round %{{x}}: {name} %{{y:,.3f}} ms<br>drafted "
                                          "%{customdata[0]}, accepted %{customdata[1]}"
                                          "<extra></extra>")
                     for key, name, phase in (("draft_s", "draft", "draft"),
                                              ("verify_s", "verify", "verify"),
                                              ("cut_s", "tail cut", "tail_cut"))])
    fig.update_layout(barmode="stack")
    s = sp.summary
    return layout(fig, f"Speculative rounds ({s.drafter}, k={s.k}): acceptance "
                       f"{s.acceptance_rate:.2f}, {s.tokens_per_verify_call:.2f} tokens "
                       f"per verification", "round", "time (ms)", height=340)


def speculation_chart(metrics: RunMetrics, recorder: Recorder, bins: int) -> list[Figure]:
    """Each speculative round's draft, verify and tail-cut time."""
    fig = _speculation(metrics)
    return [] if fig is None else [Figure(fig, wide=True)]


__all__ = ["SPECULATION_COLORS", "speculation_chart"]
