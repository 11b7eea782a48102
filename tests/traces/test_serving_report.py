"""The serving report reads in the unit of its figures: seconds where the waits are long
(a TTFT of 137 s, not "136,893.10 ms"), and latency charts whose axis spans the requests'
values, in that unit."""

from __future__ import annotations

import html
import re
from types import SimpleNamespace

from traces.serving_report import latency_figures, serving_report_html

# a queue that grows: TTFT from 0.5 s to 250 s; time per output token 90-110 ms
ROWS = [{"ttft_s": 0.5 + 249.5 * i / 99, "tpot_s": 0.09 + 0.02 * i / 99} for i in range(100)]
SERVING = {"output_tokens_per_s": 418.62, "requests_per_s": 1.2, "ttft_s_p50": 136.8931,
           "ttft_s_p90": 224.9, "ttft_s_p99": 247.5, "tpot_s_p50": 0.0991,
           "tpot_s_p90": 0.1071, "tpot_s_p99": 0.1098, "num_preemptions": 0,
           "kv_peak_occupancy": 0.5, "kv_mean_occupancy": 0.25, "duration_s": 260.0}
GEOMETRY = SimpleNamespace(num_blocks=1000, block_tokens=16, block_bytes=4096)


def _card(page: str, label: str) -> tuple[str, str]:
    m = re.search(rf'<div class="label">{re.escape(label)}</div><div class="value">([^<]*)'
                  r'</div><div class="note">([^<]*)</div>', page)
    assert m, label
    return html.unescape(m[1]), html.unescape(m[2])


def test_long_waits_are_shown_in_seconds():
    zero = dict.fromkeys(("recomputed_tokens", "swapped_bytes", "finished_requests",
                          "requests", "computed_tokens", "prompt_tokens_computed",
                          "decode_tokens_computed"), 0)
    metrics = SimpleNamespace(scenario="s", serving=SimpleNamespace(**SERVING, **zero,
                                                                    speculation=None))
    page = serving_report_html(metrics, ROWS, [[]], GEOMETRY)
    assert _card(page, "time to first token, median") == (
        "136.89 s", "p50 / p90 / p99: 136.89 / 224.90 / 247.50 s")
    assert _card(page, "time per output token, median") == (
        "99.10 ms", "p50 / p90 / p99: 99.10 / 107.10 / 109.80 ms")
    assert "136,893" not in page


def test_latency_charts_span_the_values_in_their_unit():
    ttft, tpot = latency_figures(ROWS)
    assert ttft.layout.xaxis.title.text == "time to first token (s)"
    assert max(ttft.data[0].x) == 250.0 and list(ttft.layout.xaxis.range) == [0, 250.0]
    assert tpot.layout.xaxis.title.text == "time per output token (ms)"
    assert abs(max(tpot.data[0].x) - 110.0) < 1e-9
