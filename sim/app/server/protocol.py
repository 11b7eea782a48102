"""The OpenAI API's requests, responses and errors as the server speaks them.

Requests are validated strictly (a string is no number, a boolean no integer, NaN no
temperature); fields kvsim does not know are ignored, as vLLM ignores them; parameters it
cannot honour (``n`` > 1, log probabilities, tools, penalties, ``top_p`` < 1, ...) are
refused with a 400 that names them. Errors have OpenAI's body:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, StrictStr

Number = Annotated[float, Strict()]
#: The most stop sequences a request may give (OpenAI's limit).
MAX_STOPS = 4


class ApiError(Exception):
    """A request the server refuses: an HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status, message, param, code, kind)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, kind=self.kind, param=self.param, code=self.code)


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def validation_errors(errors: list[dict[str, Any]]) -> ApiError:
    """A pydantic/FastAPI validation error as one 400 naming the field at fault: the most
    specific of the errors (a field of the union's members is named without the member),
    the others at the same place joined by "or"."""
    if not errors:
        return ApiError(400, "invalid request")
    if errors[0].get("type") == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {errors[0].get('msg', '')}")
    found = [(_field(e.get("loc", ())), e) for e in errors]
    deepest = max(len(f) for f, _ in found)
    at = [(f, e) for f, e in found if len(f) == deepest]
    param = ".".join(at[0][0]) or None
    if param is None:
        return ApiError(400, "the body must be a JSON object")
    first = at[0][1]
    if first.get("type") == "missing":
        return ApiError(400, f"{param}: a required field is missing", param=param)
    msgs: list[str] = []
    for f, e in at:
        m = str(e.get("msg", "invalid"))
        if f == at[0][0] and m not in msgs:
            msgs.append(m)
    tail = [m.removeprefix("Input should be ") for m in msgs[1:]]
    return ApiError(400, f"{param}: " + ", or ".join([msgs[0], *tail]), param=param)


def _field(loc) -> tuple[str, ...]:
    """An error's location without "body" and without the names pydantic gives a union's
    members (``str``, ``list[int]``, ...)."""
    return tuple(str(p) for p in loc if p != "body" and not (
        isinstance(p, str) and (p in ("str", "int", "float", "bool") or "[" in p)))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, frozen=True)


class StreamOptions(_Strict):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # vLLM: usage in every chunk


class _Sampling(_Strict):
    model: StrictStr
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: Number | None = Field(None, ge=0, le=2)
    top_p: Number | None = Field(None, gt=0, le=1)
    n: StrictInt | None = Field(None, ge=1)
    seed: StrictInt | None = Field(None, ge=-(2**63), lt=2**64)
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: Number | None = Field(None, ge=-2, le=2)
    frequency_penalty: Number | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, Number] | None = None
    user: StrictStr | None = None
    # vLLM's extensions that benchmark clients send
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = Field(0, ge=0)

    def stops(self) -> tuple[str, ...]:
        s = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(s) > MAX_STOPS:
            raise ApiError(400, f"stop: at most {MAX_STOPS} sequences, got {len(s)}",
                           param="stop")
        if any(x == "" for x in s):
            raise ApiError(400, "stop: an empty stop sequence", param="stop")
        return tuple(s)

    def refuse_unsupported(self) -> None:
        """A 400 naming the first parameter kvsim cannot honour."""
        bad = self._unsupported()
        if bad is not None:
            param, why = bad
            raise ApiError(400, f"{param}: {why}", param=param, code="unsupported_parameter")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options: only allowed when stream is true",
                           param="stream_options")

    def _unsupported(self) -> tuple[str, str] | None:
        if self.n not in (None, 1):
            return "n", "kvsim returns one choice per request (n = 1)"
        if self.top_p not in (None, 1):
            return "top_p", "kvsim samples from the whole distribution (top_p = 1)"
        for p in ("presence_penalty", "frequency_penalty"):
            if getattr(self, p) not in (None, 0):
                return p, "penalties are not supported (0)"
        if self.logit_bias:
            return "logit_bias", "not supported"
        return None


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    echo: StrictBool | None = False
    suffix: StrictStr | None = None
    best_of: StrictInt | None = Field(None, ge=1)
    logprobs: StrictInt | None = Field(None, ge=0)

    def _unsupported(self) -> tuple[str, str] | None:
        if self.echo:
            return "echo", "not supported"
        if self.suffix:
            return "suffix", "not supported"
        if self.best_of not in (None, 1):
            return "best_of", "kvsim returns one choice per request (best_of = 1)"
        if self.logprobs is not None:
            return "logprobs", "log probabilities are not supported"
        return super()._unsupported()


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    def _unsupported(self) -> tuple[str, str] | None:
        if self.logprobs or self.top_logprobs is not None:
            return "logprobs", "log probabilities are not supported"
        if self.tools:
            return "tools", "tool calls are not supported"
        if self.tool_choice not in (None, "none"):
            return "tool_choice", "tool calls are not supported"
        if self.response_format is not None and self.response_format.get("type") != "text":
            return "response_format", "only {'type': 'text'} is supported"
        return super()._unsupported()


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def sse(obj: dict[str, Any] | str) -> str:
    """One server-sent event of the OpenAI stream (``[DONE]`` as is)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n"
