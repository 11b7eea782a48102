"""Chat templates rendered in a bounded Jinja sandbox.

A chat template comes with the model file (``tokenizer.chat_template`` in GGUF,
``chat_template`` in ``tokenizer_config.json``), so it is input, and may be hostile:
``{{ 'x' * 3000000000 }}`` alone asks for 3 GB, two nested loops over ``range(100000)`` for
10^10 steps. Jinja's :class:`~jinja2.sandbox.ImmutableSandboxedEnvironment` keeps a template
from reaching Python's internals and from changing its arguments, and caps ``range`` at
100,000 items, but bounds neither size nor time. :class:`BoundedSandbox` adds both:

- **size**: every operation that can make a string or list longer than its inputs is
  checked *before* it runs (``*``, ``+``, ``%``, ``~``, ``str.format``, the growing
  ``str`` methods and filters, ``join``, ``sum``, ``batch``, ``slice``), and the output is
  counted as it is produced; nothing may exceed :attr:`BoundedSandbox.max_chars`
  characters (:func:`char_limit`);
- **time**: every loop step, call, attribute and filter looks at a deadline
  (:data:`MAX_RENDER_S`), so no loop runs on unchecked; recursion ends at Python's limit.

Going past a limit is a :class:`TemplateLimit` (a Jinja ``SecurityError``), which
:meth:`models.tokenizer.Tokenizer.apply_chat_template` reports as a ``ConfigError``.
"""

from __future__ import annotations

import re
import string
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

#: Characters a chat template may produce (and any value it builds may hold) beyond
#: twice its messages' own text: 4 million, more than any model's context holds as text
#: (a 1M-token context is ~4M characters). An assumption, generous for real templates,
#: which add tens of characters per message.
BASE_MAX_CHARS = 4_000_000
#: Seconds of wall time a render may take: real chat templates render in milliseconds.
MAX_RENDER_S = 5.0
#: Items a ``batch``/``slice`` filter may make (Jinja's own cap on ``range``).
MAX_ITEMS = 100_000
#: Bits an integer ``**`` may produce (a 4,096-bit number is already far past any use).
MAX_POWER_BITS = 4096

_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?[a-zA-Z%]")


class TemplateLimit(SecurityError):
    """A chat template went past a size or time bound of :class:`BoundedSandbox`."""


def char_limit(messages: Sequence[dict[str, Any]]) -> int:
    """The most characters a render of ``messages`` may produce or hold at once."""
    return BASE_MAX_CHARS + 2 * sum(len(str(v)) for m in messages for v in m.values())


class _Instrument(NodeTransformer):
    """Route every loop's iterable through ``environment.kvsim_steps`` (a deadline check
    per step) and every ``~`` through ``environment.kvsim_concat`` (a size check).
    Environment attributes cannot be shadowed by the template's own names."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = nodes.Call(nodes.EnvironmentAttribute("kvsim_steps"), [node.iter], [],
                               None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        return nodes.Call(nodes.EnvironmentAttribute("kvsim_concat"),
                          [nodes.List(list(node.nodes), lineno=node.lineno)], [], None, None,
                          lineno=node.lineno)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _length(v: Any) -> int:
    return len(v) if isinstance(v, str | list | tuple) else 0


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """An immutable Jinja sandbox whose renders are bounded in size (``max_chars``) and
    time (``max_s``); see the module docstring."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, *, max_chars: int = BASE_MAX_CHARS, max_s: float = MAX_RENDER_S):
        super().__init__(trim_blocks=True, lstrip_blocks=True)
        self.max_chars = max_chars
        self.max_s = max_s
        self.deadline = time.monotonic() + max_s
        # lipsum(n) makes n paragraphs; chat templates have no use for it
        self.globals.pop("lipsum", None)
        self.globals["raise_exception"] = _raise_exception  # Hugging Face templates call it
        for name, f in list(self.filters.items()):
            self.filters[name] = self._filter(name, f)

    # --- the bounds ---------------------------------------------------------------------

    def tick(self) -> None:
        """Raise :class:`TemplateLimit` once the render's time is up."""
        if time.monotonic() > self.deadline:
            raise TemplateLimit(f"rendering took more than {self.max_s:g} s (a loop or "
                                f"recursion too long for a chat template)")

    def size(self, n: int, what: str) -> None:
        """Refuse a value of ``n`` characters or items before ``what`` makes it."""
        if n > self.max_chars:
            raise TemplateLimit(f"{what} would make {n:,} characters or items, more than "
                                f"the {self.max_chars:,} a chat template may")

    def start(self) -> None:
        """Start the clock of one render."""
        self.deadline = time.monotonic() + self.max_s

    # --- hooks of the compiled template -------------------------------------------------

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _Instrument().visit(super()._parse(source, name, filename))

    def kvsim_steps(self, iterable: Any) -> Iterator[Any]:
        for item in iterable:
            self.tick()
            yield item

    def kvsim_concat(self, parts: list[Any]) -> str:
        texts = [str(p) for p in parts]
        self.size(sum(map(len, texts)), "'~'")
        return "".join(texts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.tick()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and _is_int(n):
                    self.size(len(seq) * max(n, 0), "'*'")
        elif operator == "+":
            self.size(_length(left) + _length(right), "'+'")
        elif operator == "**" and _is_int(left) and _is_int(right) and abs(left) > 1:
            if right * abs(left).bit_length() > MAX_POWER_BITS:
                raise TemplateLimit(f"'**' would make an integer of more than "
                                    f"{MAX_POWER_BITS} bits")
        elif operator == "%" and isinstance(left, str):
            self._percent(left, right)
        return super().call_binop(context, operator, left, right)

    def concat(self, parts: Iterable[Any]) -> str:  # Jinja's join of captured output
        texts = [str(p) for p in parts]
        self.size(sum(map(len, texts)), "captured output")
        return "".join(texts)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        __self.tick()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            name = getattr(__obj, "__name__", "")
            if name == "join" and args and not isinstance(args[0], str | list | tuple):
                args = (list(args[0]), *args[1:])  # measured, then joined: made once
            __self._str_method(owner, name, args, kwargs)
        out = super().call(__context, __obj, *args, **kwargs)
        __self.size(_length(out), f"{getattr(__obj, '__name__', 'a call')}()")
        return out

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.tick()
        return super().getitem(obj, argument)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            self._format_specs(fmt, args, kwargs)
            return wrapped(*args, **kwargs)

        return checked

    # --- checks of single operations ------------------------------------------------------

    def _widths(self, widths: Iterable[int], what: str) -> None:
        for w in widths:
            self.size(w, what)

    def _percent(self, fmt: str, args: Any) -> None:
        """``fmt % args``: no width or precision past the bound (``*`` takes it from
        ``args``)."""
        star = False
        for m in _PERCENT_SPEC.finditer(fmt):
            for g in m.groups():
                if g == "*":
                    star = True
                elif g:
                    self.size(int(g), "'%' formatting")
        values = args if isinstance(args, tuple) else (args,)
        if star:
            self._widths((v for v in values if _is_int(v)), "'%' formatting")
        self.size(len(fmt) + sum(len(str(v)) for v in values if isinstance(v, str)),
                  "'%' formatting")

    def _format_specs(self, fmt: str, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """``fmt.format(...)``: no width in a field's spec past the bound (a nested
        ``{}`` takes it from the arguments)."""
        nested = False
        try:
            fields = list(string.Formatter().parse(fmt))
        except ValueError:
            return  # str.format itself will refuse it
        for _, _, spec, _ in fields:
            if spec:
                nested = nested or "{" in spec
                self._widths((int(d) for d in re.findall(r"\d+", spec)), "str.format")
        if nested:
            self._widths((v for v in (*args, *kwargs.values()) if _is_int(v)), "str.format")

    def _str_method(self, s: str, name: str, args: tuple, kwargs: dict[str, Any]) -> None:
        values = (*args, *kwargs.values())
        if name in ("ljust", "rjust", "center", "zfill"):
            self._widths((v for v in values if _is_int(v)), f"str.{name}")
        elif name == "expandtabs":
            tab = next((v for v in values if _is_int(v)), 8)
            self.size(len(s) + s.count("\t") * max(tab, 0), "str.expandtabs")
        elif name == "replace" and len(args) >= 2:
            self.size(_replaced(s, str(args[0]), str(args[1]), args[2] if len(args) > 2
                                else -1), "str.replace")
        elif name == "join" and args:
            items = args[0]
            self.size(sum(len(str(x)) for x in items) + len(s) * max(len(items) - 1, 0),
                      "str.join")
        elif name == "translate" and args and isinstance(args[0], dict):
            longest = max((len(str(v)) for v in args[0].values() if v is not None),
                          default=1)
            self.size(len(s) * longest, "str.translate")

    def _filter(self, name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        """``f`` with a deadline check, a check of its arguments where it can grow its
        input (before it runs) and of its result's size (after)."""
        def bounded(*args: Any, **kwargs: Any) -> Any:
            self.tick()
            if name in _MEASURED_VALUE:  # an iterator is measured, then used: made once
                i = next((i for i, a in enumerate(args) if not _is_env(a)), None)
                if i is not None and not isinstance(args[i], str | list | tuple | dict):
                    args = (*args[:i], list(args[i]), *args[i + 1:])
            self._filter_args(name, args, kwargs)
            out = f(*args, **kwargs)
            self.size(_length(out), f"the {name} filter")
            return out

        for attr in ("jinja_pass_arg",):  # keep Jinja's context/environment passing mark
            if hasattr(f, attr):
                setattr(bounded, attr, getattr(f, attr))
        bounded.__name__ = getattr(f, "__name__", name)
        return bounded

    def _filter_args(self, name: str, args: tuple, kwargs: dict[str, Any]) -> None:
        # args[0] is the value (after the environment/context a marked filter gets)
        values = [a for a in args if not _is_env(a)]
        value, rest = (values[0], values[1:]) if values else (None, [])
        text = str(value) if value is not None else ""
        opts = (*rest, *kwargs.values())
        if name == "center":
            self._widths((v for v in opts if _is_int(v)), "the center filter")
        elif name == "indent":
            width = next(iter(opts), 4)
            pad = len(width) if isinstance(width, str) else (width if _is_int(width) else 4)
            self.size(len(text) + (text.count("\n") + 1) * max(pad, 0), "the indent filter")
        elif name == "wordwrap":
            width = next((v for v in opts if _is_int(v)), 79)
            wrap = kwargs.get("wrapstring") or next((v for v in rest[3:4]), "\n")
            self.size(len(text) + len(str(wrap)) * (len(text) // max(width, 1) + 1),
                      "the wordwrap filter")
        elif name == "replace" and len(rest) >= 2:
            self.size(_replaced(text, str(rest[0]), str(rest[1]),
                                rest[2] if len(rest) > 2 else -1), "the replace filter")
        elif name == "join":
            sep = str(rest[0]) if rest else str(kwargs.get("d", ""))
            items = value if isinstance(value, str | list | tuple | dict) else []
            self.size(sum(len(str(x)) for x in items) + len(sep) * max(len(items) - 1, 0),
                      "the join filter")
        elif name == "sum":
            items = value if isinstance(value, str | list | tuple | dict) else []
            self.size(sum(_length(x) for x in items), "the sum filter")
        elif name in ("batch", "slice"):
            for v in opts:
                if _is_int(v) and v > MAX_ITEMS:
                    raise TemplateLimit(f"the {name} filter asks for {v:,} items, more than "
                                        f"{MAX_ITEMS:,}")
        elif name == "format":
            self._percent(text, tuple(rest))
        elif name == "truncate":
            self.size(sum(len(str(v)) for v in opts if isinstance(v, str)), "the truncate "
                                                                              "filter")


#: Filters whose value is measured before they run (an iterator becomes a list first).
_MEASURED_VALUE = ("join", "sum")


def _is_env(v: Any) -> bool:
    """An environment or context Jinja passes to a marked filter first."""
    from jinja2.environment import Environment
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    return isinstance(v, Environment | EvalContext | Context)


def _replaced(s: str, old: str, new: str, count: Any) -> int:
    """The length of ``s.replace(old, new, count)``, without making it."""
    hits = s.count(old) if old else len(s) + 1
    if _is_int(count) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * (len(new) - len(old))


def _raise_exception(message: str) -> None:
    """Hugging Face templates' way to refuse a conversation (``raise_exception(msg)``)."""
    raise TemplateError(str(message))


def render_chat_template(source: str, messages: Sequence[dict[str, Any]], *,
                         max_s: float | None = None, **variables: Any) -> str:
    """``source`` rendered with ``messages`` and ``variables`` in a fresh
    :class:`BoundedSandbox`: at most :func:`char_limit` characters and ``max_s`` seconds
    (default :data:`MAX_RENDER_S`);
    past either, :class:`TemplateLimit`. Other Jinja errors propagate
    (:class:`jinja2.TemplateError`); so does a template too deeply recursive
    (``RecursionError``)."""
    env = BoundedSandbox(max_chars=char_limit(messages),
                         max_s=MAX_RENDER_S if max_s is None else max_s)
    env.start()
    template = env.from_string(source)
    env.start()  # compiling does not count against the render
    out: list[str] = []
    total = 0
    for piece in template.generate(messages=list(messages), **variables):
        total += len(piece)
        env.size(total, "the template's output")
        env.tick()
        out.append(piece)
    return "".join(out)


__all__ = ["BASE_MAX_CHARS", "MAX_RENDER_S", "BoundedSandbox", "TemplateLimit", "char_limit",
           "render_chat_template"]
