"""``/metrics``: Prometheus text with vLLM's metric names, so dashboards made for vLLM read
the simulated card; kvsim's own under ``kvsim:``.

Names, kinds and labels (``model_name``, ``engine``: the chip) follow vLLM's metrics
(docs/design/metrics.md of vLLM; its v1 ``loggers.py`` for the histogram buckets, which are
copied as numbers). Every time is **simulated** seconds (the card's, not the wall clock's;
under ``--pace real`` with ``--time-scale 1`` they are also the wall's, up to the lag).
``vllm:gpu_cache_usage_perc`` is the NPU's KV block pool (vLLM v0's name; v1's is
``vllm:kv_cache_usage_perc``, exported too): 1.0 = every block in use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)

from sim.units import PS_PER_S

if TYPE_CHECKING:
    from sim.app.server.engine import Live
    from sim.serving.online import OnlineChip, OnlineStep

#: vLLM's buckets (seconds) for time to first token
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
#: vLLM's buckets (seconds) for time per output token / inter-token latency
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
#: vLLM's buckets (seconds) for whole-request latencies (end to end, queue)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
#: finish reasons as vLLM counts them (a cancelled request is an abort)
REASONS = {"stop": "stop", "length": "length", "cancelled": "abort", "error": "error"}


def buckets_1_2_5(largest: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``largest`` (vLLM's token-count buckets)."""
    out, m = [], 1
    while True:
        for k in (1, 2, 5):
            if k * m > largest:
                return out
            out.append(k * m)
        m *= 10


class ServerMetrics:
    """The server's metrics in their own registry (several servers in one process)."""

    def __init__(self, *, model_name: str, chips: int, num_blocks: int, max_model_len: int,
                 info: dict[str, str]):
        # no ``*_created`` series (vLLM turns them off too); a process-wide setting
        disable_created_metrics()
        self.registry = r = CollectorRegistry()
        self.model = model_name
        lab = ["model_name", "engine"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, lab, registry=r)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled "
                             "(arrived, not yet admitted, or preempted by recomputation).")
        self.swapped = gauge("vllm:num_requests_swapped", "Requests swapped out to host "
                             "memory over PCIe.")
        doc = "KV block pool usage of the NPU's DRAM (1 = every block in use)."
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", doc)
        self.gpu_usage = gauge("vllm:gpu_cache_usage_perc", doc + " vLLM v0's name.")
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions.", lab, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens prefilled (each "
                                     "request's, once).", lab, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Output tokens.", lab,
                                         registry=r)
        self.success = Counter("vllm:request_success", "Finished requests.",
                               [*lab, "finished_reason"], registry=r)

        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, lab, buckets=buckets, registry=r)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token "
                         "(simulated seconds).", TTFT_BUCKETS)
        self.tpot = hist("vllm:time_per_output_token_seconds", "Time between output tokens "
                         "(simulated seconds).", TPOT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Time between output tokens "
                        "(simulated seconds).", TPOT_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to last token "
                        "(simulated seconds).", REQUEST_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Arrival to first scheduled "
                          "step (simulated seconds).", REQUEST_BUCKETS)
        tokens = buckets_1_2_5(max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Prompt tokens per request.",
                               tokens)
        self.req_gen = hist("vllm:request_generation_tokens", "Output tokens per request.",
                            tokens)
        self.clock = gauge("kvsim:simulated_time_seconds", "The chip's simulated clock.")
        self.steps = Counter("kvsim:steps", "Steps the chip ran.", lab, registry=r)
        self.lag = gauge("kvsim:pace_lag_seconds", "Pace real: how late the last step's "
                         "tokens left after their simulated time (wall seconds).")
        self.lag_max = gauge("kvsim:pace_lag_max_seconds", "Pace real: the largest lag so "
                             "far (wall seconds).")
        self.late = Counter("kvsim:pace_late_steps", "Pace real: steps whose tokens left "
                            "later than the lag tolerance (the simulator behind the clock).",
                            lab, registry=r)
        self.blocks = gauge("kvsim:kv_cache_blocks", "KV blocks of the chip's pool.")
        Info("kvsim:server", "How this server runs.", registry=r).info(info)
        self._lag_max = [0.0] * chips
        for c in range(chips):
            e = self._lab(c)
            self.blocks.labels(*e).set(num_blocks)
            for g in (self.running, self.waiting, self.swapped, self.kv_usage,
                      self.gpu_usage, self.clock, self.lag, self.lag_max):
                g.labels(*e).set(0)

    def _lab(self, chip: int) -> tuple[str, str]:
        return (self.model, str(chip))

    def arrived(self, chip: int) -> None:
        self.waiting.labels(*self._lab(chip)).inc()

    def step(self, chip: OnlineChip, step: OnlineStep, lag: float | None, late: bool) -> None:
        """After ``step`` of ``chip`` was reached."""
        e = self._lab(chip.index)
        s = chip.scheduler
        self.running.labels(*e).set(len(s.running))
        self.waiting.labels(*e).set(len(s.waiting) + len(chip.inbox))
        self.swapped.labels(*e).set(len(s.swapped))
        usage = s.used_blocks / s.geo.num_blocks
        self.kv_usage.labels(*e).set(usage)
        self.gpu_usage.labels(*e).set(usage)
        if step.record.preempted:
            self.preemptions.labels(*e).inc(len(step.record.preempted))
        self.steps.labels(*e).inc()
        self.clock.labels(*e).set(chip.clock_ps / PS_PER_S)
        if step.sampled:
            self.generation_tokens.labels(*e).inc(len(step.sampled))
        first = sum(r.prompt_tokens for r in step.sampled if len(r.token_ps) == 1)
        if first:
            self.prompt_tokens.labels(*e).inc(first)
        if lag is not None:
            self.lag.labels(*e).set(lag)
            self._lag_max[chip.index] = max(self._lag_max[chip.index], lag)
            self.lag_max.labels(*e).set(self._lag_max[chip.index])
            if late:
                self.late.labels(*e).inc()

    def finished(self, live: Live) -> None:
        """A request ended (its last piece handed over)."""
        r = live.req
        e = self._lab(r.chip)
        self.success.labels(*e, REASONS[live.finish]).inc()
        s = PS_PER_S
        if r.token_ps:
            self.ttft.labels(*e).observe((r.token_ps[0] - r.arrival_ps) / s)
            for a, b in zip(r.token_ps, r.token_ps[1:], strict=False):
                self.tpot.labels(*e).observe((b - a) / s)
                self.itl.labels(*e).observe((b - a) / s)
        if r.finish_ps is not None:
            self.e2e.labels(*e).observe((r.finish_ps - r.arrival_ps) / s)
        if live.scheduled_ps is not None:
            self.queue.labels(*e).observe((live.scheduled_ps - r.arrival_ps) / s)
        self.req_prompt.labels(*e).observe(r.prompt_tokens)
        self.req_gen.labels(*e).observe(len(r.token_ps))
