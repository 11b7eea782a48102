"""Chat templates are input: a hostile one is refused with one ConfigError naming the file,
without the memory or the time it asks for (models.chat_template); real templates render
as before."""

from __future__ import annotations

import pytest

from kvsim.errors import ConfigError
from models.tokenizer import Tokenizer

USER = [{"role": "user", "content": "hi"}]


class _Backend:
    """The least a Tokenizer needs to render a template (no special tokens)."""

    def id_to_token(self, i: int) -> str:
        return ""


def _tok(template: str) -> Tokenizer:
    return Tokenizer(_Backend(), bos_id=None, eos_id=None, chat_template=template,
                     source="model.gguf")


# Each would make tens of MB to TB. The sizes where a check did not exist before are kept
# small enough (<= 64 MB) that the test could run, and fail, without the bounds.
BOMBS = {
    "string times a number": "{{ 'x' * 50000000 }}",
    "the issue's template": "{{ 'x' * 3000000000 }}",
    "doubling in a namespace with ~": "{% set ns = namespace(s='x') %}{% for i in range(26) %}"
                                      "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "doubling with +": "{% set ns = namespace(s='x') %}{% for i in range(26) %}"
                       "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "a list times a number": "{{ ([1] * 50000000)|length }}",
    "percent width": "{{ '%050000000d' % 1 }}",
    "str.format width": "{{ '{:>50000000}'.format(1) }}",
    "ljust": "{{ 'x'.ljust(50000000) }}",
    "center filter": "{{ 'x'|center(50000000) }}",
    "indent filter": "{{ ('a\\n' * 1000)|indent(50000) }}",
    "replace filter": "{{ ('a' * 1000)|replace('a', 'b' * 50000) }}",
    "str.replace": "{{ ('a' * 1000).replace('a', 'b' * 50000) }}",
    "join filter": "{{ (['x' * 1000000] * 50)|join }}",
    "str.join": "{{ ''.join(['x' * 1000000] * 50) }}",
    "captured block": "{% set b %}{% for i in range(50) %}{{ 'x' * 1000000 }}"
                      "{% endfor %}{% endset %}{{ b|length }}",
    "output": "{% for i in range(50) %}{{ 'x' * 1000000 }}{% endfor %}",
    "huge power": "{{ (10 ** 10000000) % 7 }}",
}


@pytest.mark.parametrize("template", BOMBS.values(), ids=BOMBS.keys())
def test_a_template_past_the_size_bound_is_refused(template):
    with pytest.raises(ConfigError, match=r"model\.gguf: chat template fails: .*(more than|"
                                          r"bits)"):
        _tok(template).apply_chat_template(USER)


def test_a_template_past_the_time_bound_is_refused(monkeypatch):
    import models.chat_template as ct

    monkeypatch.setattr(ct, "MAX_RENDER_S", 0.05)
    # 10^10 steps without a bound (3,000 x 3,000 here: seconds, unbounded)
    loops = ("{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}"
             "{% endfor %}done")
    with pytest.raises(ConfigError, match="chat template fails: rendering took more than "
                                          "0.05 s"):
        _tok(loops).apply_chat_template(USER)


def test_a_recursive_template_is_refused():
    t = "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"
    with pytest.raises(ConfigError, match="chat template fails"):
        _tok(t).apply_chat_template(USER)


def test_templates_as_models_write_them_render_as_before():
    t = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}"
         "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
         "{% endif %}{{ messages | map(attribute='content') | join(', ') }}"
         "{{ '%s/%d' % ('a', 2) }}{{ '{}-{}'.format(1, 2) }}{{ 'ab'.replace('a', 'x') }}"
         "{{ ', '.join(['p', 'q']) }}{{ messages | length }}")
    msgs = [{"role": "system", "content": " s "}, {"role": "user", "content": "u"}]
    assert _tok(t).apply_chat_template(msgs) == (
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
        "<|im_start|>assistant\n s , ua/21-2xbp, q2")


def test_raise_exception_of_hugging_face_templates_is_a_config_error():
    t = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('needs a system turn') }}" \
        "{% endif %}"
    with pytest.raises(ConfigError, match="chat template fails: needs a system turn"):
        _tok(t).apply_chat_template(USER)
