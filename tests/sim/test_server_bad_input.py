"""Hostile and malformed requests to ``kvsim serve --http``: each gets an OpenAI error body
with a 4xx status that names what is wrong, never a traceback or a 5xx; the server goes on
serving after them."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import pytest

from tests.sim.server_util import grid_cache, need_server, running_server, tiny_tree

need_server()

OK = {"model": "tiny", "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
C, H = "/v1/completions", "/v1/chat/completions"


def _with(base: dict, **kw) -> bytes:
    return json.dumps(base | kw).encode()


# (name, path, body bytes, status, words the message must contain)
CASES = [
    ("not JSON", C, b"{model: tiny", 400, "not valid JSON"),
    ("invalid UTF-8", C, b'{"model": "tiny", "prompt": "\xff\xfe"}', 400, ""),
    ("a JSON array", C, b"[1, 2]", 400, "JSON object"),
    ("an empty body", C, b"", 400, "JSON object"),
    ("JSON nested 100,000 deep", C, b"[" * 100_000 + b"]" * 100_000, 400, ""),
    ("no model", C, json.dumps({"prompt": "x"}).encode(), 400, "model"),
    ("an unknown model", C, _with(OK, model="gpt-4"), 404, "does not exist"),
    ("no prompt", C, json.dumps({"model": "tiny"}).encode(), 400, "prompt"),
    ("a prompt of a number", C, _with(OK, prompt=5), 400, "prompt"),
    ("an empty prompt", C, _with(OK, prompt=""), 400, "no tokens"),
    ("two prompts", C, _with(OK, prompt=["a", "b"]), 400, "one prompt"),
    ("a token id past the vocabulary", C, _with(OK, prompt=[1, 256]), 400, "256"),
    ("a negative token id", C, _with(OK, prompt=[-1]), 400, "-1"),
    ("max_tokens as a string", C, _with(OK, max_tokens="5"), 400, "max_tokens"),
    ("max_tokens 0", C, _with(OK, max_tokens=0), 400, "max_tokens"),
    ("max_tokens as a boolean", C, _with(OK, max_tokens=True), 400, "max_tokens"),
    ("max_tokens past the context", C, _with(OK, max_tokens=10**9), 400,
     "maximum context length is 512"),
    ("a prompt past the context", C, _with(OK, prompt="x" * 600, max_tokens=None), 400,
     "maximum context length"),
    ("temperature NaN", C, b'{"model": "tiny", "prompt": "x", "temperature": NaN}', 400,
     "temperature"),
    ("temperature Infinity", C, b'{"model": "tiny", "prompt": "x", "temperature": Infinity}',
     400, "temperature"),
    ("temperature 5", C, _with(OK, temperature=5), 400, "temperature"),
    ("temperature as text", C, _with(OK, temperature="hot"), 400, "temperature"),
    ("a seed of 2**70", C, _with(OK, seed=2**70), 400, "seed"),
    ("five stop sequences", C, _with(OK, stop=["a", "b", "c", "d", "e"]), 400, "at most 4"),
    ("an empty stop sequence", C, _with(OK, stop=""), 400, "empty stop"),
    ("n = 2", C, _with(OK, n=2), 400, "n:"),
    ("log probabilities", C, _with(OK, logprobs=3), 400, "logprobs"),
    ("echo", C, _with(OK, echo=True), 400, "echo"),
    ("top_p 0.5", C, _with(OK, top_p=0.5), 400, "top_p"),
    ("a presence penalty", C, _with(OK, presence_penalty=1.0), 400, "presence_penalty"),
    ("stream as text", C, _with(OK, stream="yes"), 400, "stream"),
    ("stream_options without stream", C, _with(OK, stream_options={"include_usage": True}),
     400, "stream_options"),
    ("min_tokens past max_tokens", C, _with(OK, min_tokens=5), 400, "min_tokens"),
    ("no messages", H, _with(CHAT, messages=[]), 400, "messages"),
    ("a message with an unknown role", H,
     _with(CHAT, messages=[{"role": "wizard", "content": "x"}]), 400, "role"),
    ("an image in a message", H, _with(CHAT, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), 400, "messages"),
    ("a message of a number", H, _with(CHAT, messages=[{"role": "user", "content": 3}]), 400,
     "content"),
    ("tools", H, _with(CHAT, tools=[{"type": "function", "function": {"name": "f"}}]), 400,
     "tools"),
    ("a JSON response format", H, _with(CHAT, response_format={"type": "json_object"}), 400,
     "response_format"),
    ("chat log probabilities", H, _with(CHAT, logprobs=True), 400, "logprobs"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tree = tiny_tree(grid_cache(tmp_path_factory), max_body_bytes=4 * 2**20)
    with running_server(tree) as (url, svc):
        yield url, svc


def _request(url: str, method: str, path: str, body: bytes | None = None,
             headers: dict | None = None) -> tuple[int, dict]:
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request(method, path, body, {"content-type": "application/json"} | (headers or {}))
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else {}


@pytest.mark.parametrize("name,path,body,status,words", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_an_openai_error(server, name, path, body, status, words):
    url, _ = server
    got, data = _request(url, "POST", path, body)
    assert got == status, data
    err = data["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and words in err["message"]
    assert "Traceback" not in err["message"]


def test_methods_routes_and_sizes(server):
    url, svc = server
    assert _request(url, "GET", C)[0] == 405
    status, data = _request(url, "GET", "/v2/nothing")
    assert status == 404 and data["error"]["message"] == "Not Found"
    big = _with(OK, prompt="x" * (5 * 2**20))  # over the 4 MiB body limit
    status, data = _request(url, "POST", C, big)
    assert status == 413 and "exceeds" in data["error"]["message"]
    status, _ = _request(url, "POST", C, b"{}", {"content-length": "99999999999"})
    assert status == 413
    # after all of it the server serves, and nothing was left half-admitted
    status, data = _request(url, "POST", C, _with(OK))
    assert status == 200 and data["usage"]["completion_tokens"] == 2
    assert all(r.state == "finished" for r in svc.engine.online.requests)
    assert _request(url, "GET", "/health") == (200, {"status": "ok"})
