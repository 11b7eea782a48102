"""``kvsim serve --http`` with real clients: the official ``openai`` client (streaming and not,
concurrent requests), ``/metrics`` scraped and parsed, the requests' simulated figures
against the offline serving simulation of the same arrivals, stop sequences, seeds, a
client that goes away, and the NPU's own tokens in functional mode (tiny model, timing
mode unless said)."""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest

from tests.sim.server_util import (
    SKIP_OPENAI,
    grid_cache,
    need_server,
    running_server,
    tiny_tree,
)

need_server()
openai = pytest.importorskip("openai", reason=SKIP_OPENAI)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    with running_server(tiny_tree(grid_cache(tmp_path_factory)), tmp / "out") as (url, svc):
        yield url, svc


def _client(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def test_openai_client_completion_and_chat(server):
    url, svc = server
    c = _client(url)
    assert [m.id for m in c.models.list().data] == ["tiny"]
    r = c.completions.create(model="tiny", prompt="Hello", max_tokens=12, seed=7)
    ch = r.choices[0]
    # the byte tokenizer: 5 prompt tokens, one printable character per output token
    assert (ch.finish_reason, len(ch.text)) == ("length", 12)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        5, 12, 17)
    ext = r.model_extra["kvsim"]
    assert len(ext["token_times_s"]) == 12 and ext["ttft_s"] > 0
    assert ext["first_token_s"] == ext["token_times_s"][0] == pytest.approx(
        ext["arrival_s"] + ext["ttft_s"], rel=1e-12)
    assert bytes(ext["token_ids"]).decode() == ch.text
    raw = c.completions.with_raw_response.create(
        model="tiny", prompt="Hello", max_tokens=2, extra_headers={"X-Request-ID": "c-7"})
    assert raw.headers["x-request-id"] == "c-7" and raw.headers["x-kvsim-pace"] == "none"
    assert svc.engine.lives[raw.parse().model_extra["kvsim"]["rid"]].client_id == "c-7"
    # the same request streamed: the same text, token by token, then the usage
    chunks = list(c.completions.create(model="tiny", prompt="Hello", max_tokens=12, seed=7,
                                       stream=True, stream_options={"include_usage": True}))
    assert "".join(k.choices[0].text for k in chunks[:-1]) == ch.text
    assert [k.model_extra["kvsim"]["token"] for k in chunks[:-1]] == list(range(12))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    # chat: the template-less tokenizer's "role: content" prompt
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    stream = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, stream=True,
                                       stream_options={"include_usage": True}, temperature=0)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [k.choices[0].finish_reason for k in chunks[:-1]] == [None] * 4 + ["length"]
    n_prompt = len("system: Be brief.\nuser: Hi\nassistant:")
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (n_prompt, 5)
    whole = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0)
    assert whole.choices[0].message.content == "".join(
        k.choices[0].delta.content for k in chunks[:-1])  # greedy: the same prompt, the same text


def test_stop_sequences_and_seeds(server):
    url, _ = server
    c = _client(url)

    def text(**kw):
        r = c.completions.create(model="tiny", prompt="Once", max_tokens=40, **kw)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens

    full, _, _ = text(seed=3)
    assert text(seed=3)[0] == full and text(seed=4)[0] != full
    stop = full[20:23]
    cut = full.find(stop)
    assert text(seed=3, stop=[stop]) == (full[:cut], "stop", cut + 3)
    chunks = list(c.completions.create(model="tiny", prompt="Once", max_tokens=40, seed=3,
                                       stop=stop, stream=True))
    assert "".join(k.choices[0].text for k in chunks) == full[:cut]
    assert chunks[-1].choices[0].finish_reason == "stop"
    # before min_tokens a stop sequence does not end the text (vLLM's rule)
    r = c.completions.create(model="tiny", prompt="Once", max_tokens=40, seed=3, stop=stop,
                             extra_body={"min_tokens": cut + 3 + 1})
    assert r.choices[0].text.startswith(full[:cut + 3])


def _replay(svc):
    """The server's requests (their arrival stamps and token counts) through the offline
    serving simulation, on the server's cost models."""
    from sim.serving.engine import ServingSim
    from sim.serving.scheduler import Request

    reqs = [Request(r.rid, r.arrival_ps, r.prompt_tokens, r.output_tokens)
            for r in svc.engine.online.requests]
    p = svc.parts
    sim = ServingSim(reqs, chips=svc.cfg.serving.chips, scheduler=p.scheduler,
                     geometry=p.geometry, step_cost=p.cost.step_ps, plan_cost=p.cost.plan_ps,
                     swap_cost=p.swap, router=svc.cfg.serving.router)
    sim.run()
    return reqs, sim


def test_concurrent_requests_are_the_serving_simulation(server):
    url, svc = server
    c = _client(url)
    before = len(svc.engine.online.requests)

    def one(i: int):
        s = c.completions.create(model="tiny", prompt="x" * (10 + 7 * i), max_tokens=6 + i,
                                 stream=True)
        return [(k.choices[0].text, k.model_extra["kvsim"]["t_s"]) for k in s]

    with ThreadPoolExecutor(8) as ex:
        outs = list(ex.map(one, range(8)))
    assert [len(o) for o in outs] == [6 + i for i in range(8)]
    # every request of the server so far, replayed offline from its arrival stamp: the
    # same step at the same picosecond for every token of every request
    reqs, sim = _replay(svc)
    served = svc.engine.online.requests
    for a, b in zip(served, reqs, strict=True):
        assert (a.token_ps, a.finish_ps, a.preemptions) == (b.token_ps, b.finish_ps,
                                                            b.preemptions)
    steps = [(s.start_ps, s.end_ps, s.items) for s in svc.engine.online.chips[0].steps]
    assert steps == [(s.start_ps, s.end_ps, s.items) for s in sim.chips[0].steps]
    for i, out in enumerate(outs):  # each chunk's simulated time is its token's
        r = served[before + i] if served[before + i].prompt_tokens == 10 + 7 * i else next(
            q for q in served[before:] if q.prompt_tokens == 10 + 7 * i)
        assert [round(t * 1e12) for _, t in out] == r.token_ps


def _get(url: str, path: str) -> tuple[int, dict, bytes]:
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", path)
    resp = conn.getresponse()
    return resp.status, dict(resp.getheaders()), resp.read()


def test_metrics_are_scraped_with_vllm_names(server):
    from prometheus_client.parser import text_string_to_metric_families

    url, svc = server
    c = _client(url)
    c.completions.create(model="tiny", prompt="Hello there", max_tokens=4)
    status, headers, body = _get(url, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    fam = {f.name: f for f in text_string_to_metric_families(body.decode())}

    def value(name: str, suffix: str = "") -> float:
        return sum(s.value for s in fam[name].samples if s.name == name + suffix)

    done = [r for r in svc.engine.online.requests if r.state == "finished"]
    assert value("vllm:time_to_first_token_seconds", "_count") == len(done)
    assert value("vllm:time_per_output_token_seconds", "_count") == sum(
        len(r.token_ps) - 1 for r in done)
    assert value("vllm:e2e_request_latency_seconds", "_count") == len(done)
    assert value("vllm:generation_tokens", "_total") == sum(len(r.token_ps) for r in done)
    assert value("vllm:prompt_tokens", "_total") == sum(r.prompt_tokens for r in done)
    assert value("vllm:request_success", "_total") == len(done)
    ttft = [(r.token_ps[0] - r.arrival_ps) / 1e12 for r in done]
    assert value("vllm:time_to_first_token_seconds", "_sum") == pytest.approx(sum(ttft))
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"):
        assert value(name) == 0  # every request finished: nothing runs, no block is held
    assert value("vllm:num_preemptions", "_total") == 0
    assert value("kvsim:steps", "_total") == len(svc.engine.online.chips[0].steps)
    info = next(s for s in fam["kvsim:server_info"].samples)
    assert info.labels["pace"] == "none" and info.labels["tokenizer"] == "bytes"
    assert _get(url, "/health")[0] == 200


def test_a_client_that_goes_away_is_cancelled(tmp_path, tmp_path_factory):
    # pace real, 2,000 wall seconds per simulated second: a tiny decode step ~0.16 s
    tree = tiny_tree(grid_cache(tmp_path_factory), pace="real", time_scale=2000.0)
    with running_server(tree, tmp_path / "out") as (url, svc):
        u = urlparse(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps(
            {"model": "tiny", "prompt": "Hi", "max_tokens": 200, "stream": True}),
            {"content-type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("x-kvsim-pace") == "real; time-scale=2000"
        assert float(resp.getheader("x-kvsim-lag-s")) >= 0
        assert resp.getheader("x-kvsim-behind") in ("0", "1")
        first = resp.readline()
        assert first.startswith(b"data: {")
        conn.sock.close()  # the client goes away mid-stream
        conn.close()
        live = svc.engine.lives[0]
        deadline = time.monotonic() + 30
        while live.finish is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert live.finish == "cancelled" and live.req.state == "finished"
        assert 1 <= live.req.generated < 200 and live.req.output_tokens == live.req.generated
        chip = svc.engine.online.chips[0]
        assert chip.scheduler.used_blocks == 0  # its blocks are free again
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m["server"]["finish_reasons"] == {"cancelled": 1}
    row = (tmp_path / "out" / "http_requests.csv").read_text().splitlines()[1].split(",")
    assert row[:5] == ["0", "", "completions", "True", "cancelled"]
    assert m["serving"]["requests"] == 1 and m["server"]["pace"] == "real"


def test_functional_mode_sends_the_npus_tokens(tmp_path_factory):
    import numpy as np

    from models.source import load_model, resolve_model
    from sim.app.quality import ready_for_text
    from sim.device.hw import load_hardware

    tree = tiny_tree(grid_cache(tmp_path_factory), fidelity="functional")
    with running_server(tree) as (url, svc):
        r = _client(url).completions.create(model="tiny", prompt="Hi!", max_tokens=5,
                                            temperature=0)
        ids = r.model_extra["kvsim"]["token_ids"]
        assert r.system_fingerprint == "functional; tokenizer=bytes"
    assert len(ids) == 5 and load_model("tiny").vocab_size == 256
    # the same prompt through the same compiled model, greedily, outside the server
    bits = svc.cfg.bits.bit_config(svc.cfg.kv)
    ready = ready_for_text(resolve_model("tiny"), bits, kv="int8", hw=load_hardware("tiny"),
                           tokens=svc.max_model_len)
    model = ready.launch()
    [logits] = model.infer(ready.embed(list(b"Hi!")), cache_size=0)
    want = []
    for k in range(5):
        want.append(int(np.argmax(logits)))
        [logits] = model.infer(ready.embed([want[-1]]), cache_size=3 + k)
    model.dispose()
    assert ids == want
