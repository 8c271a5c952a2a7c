"""Turns a list of chat messages into a prompt string with the model's own Jinja chat template.

Templates come from model files, so they run in jinja2's immutable sandbox, configured the way Hugging Face's
`apply_chat_template` configures it (trim_blocks, lstrip_blocks, loop controls, `tojson`, `raise_exception`,
`strftime_now`): a template renders here exactly as it does in transformers.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.meta
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# What a model without a template gets: ChatML turns, text parts of list contents joined.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class TemplateError(ValueError):
    """The chat template refused the messages (`raise_exception`) or failed while rendering them."""


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering ignores it."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[Any]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
    """Like transformers' `tojson`: plain JSON, no HTML escaping, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """Templates read an assistant's reasoning as `reasoning_content` (most) or `thinking` (gpt-oss); callers may
    send it under either name or as `reasoning`, so every name is filled, as transformers does."""
    reasoning = next(
        (message[k] for k in ("reasoning_content", "thinking", "reasoning") if message.get(k) is not None), None
    )
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationBlock]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template. `source=None` gives ChatML; a template that does not compile raises TemplateError."""

    def __init__(self, source: str | None, bos_token: str | None = None, eos_token: str | None = None):
        self.source = CHATML_TEMPLATE if source is None else source
        # An unset special token stays undefined (renders as ""), as in transformers.
        self._tokens = {name: value for name, value in (("bos_token", bos_token), ("eos_token", eos_token)) if value}
        env = _environment()
        try:
            self._template = env.from_string(self.source)
            # Whether the template renders `tools` itself; one that does not gets them as text (tool_prompt.py).
            self.reads_tools = "tools" in jinja2.meta.find_undeclared_variables(env.parse(self.source))
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"chat template does not compile: {exc} (line {exc.lineno})") from exc

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text. `enable_thinking=None` leaves the variable undefined, so the template's default applies."""
        messages = [_alias_reasoning(message) for message in messages]
        variables = {**self._tokens, **extra, "messages": messages, "tools": tools}
        variables["add_generation_prompt"] = add_generation_prompt
        if enable_thinking is not None:
            variables["enable_thinking"] = enable_thinking
        try:
            return self._template.render(**variables)
        except TemplateError:
            raise
        except Exception as exc:  # a model's template can fail in any way Python can; the caller's messages caused it
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
