"""Tools into the prompt (inference/engine/text/tool_prompt.py): the dialect each kind of model gets, tools and past
calls written as text for a template that does not read `tools`, and calls written back exactly as the dialect's
parser reads them (so a later turn renders what the model wrote)."""

import json

import pytest

from inference.engine.contract.dialects.base import DIALECTS
from inference.engine.contract.dialects.registry import DIALECT
from inference.engine.demo_model import CHAT_TEMPLATE
from inference.engine.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from inference.engine.text.tool_prompt import choose_dialect, with_decoded_arguments, with_tools_as_text
from tests.tool_parsing import parse_tool_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "hourly": {"type": "boolean"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
]


@pytest.mark.parametrize(
    ("template", "name", "architecture", "bos", "dialect"),
    [
        ("{{ '<tool_call>' }}", "qwen", "qwen2", False, "hermes"),
        ("{{ '<function=' }}", "coder", "qwen3", False, "qwen3_coder"),
        ("{{ '<function name=\"' }}", "m", "llama", False, "minicpm"),
        ("{{ '<tool_call>' }}", "ornith-7b", "llama", False, "json"),
        ("{{ messages }}", "Ornith", "qwen2", False, "json"),
        ("{{ messages }}", "minicpm5", "llama", True, "minicpm"),
        ("{{ messages }}", "plain", "llama", False, "qwen3_coder"),
        ("{{ messages }}", "plain", "qwen3", True, "qwen3_coder"),
    ],
)
def test_the_dialect_comes_from_the_template_then_the_name_and_architecture(template, name, architecture, bos, dialect):
    assert choose_dialect(template, name=name, architecture=architecture, template_writes_bos=bos) == dialect


def test_a_template_that_reads_tools_is_told_apart_from_one_that_does_not():
    assert ChatTemplate(CHAT_TEMPLATE).reads_tools
    assert not ChatTemplate(CHATML_TEMPLATE).reads_tools


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_written_call_parses_back_to_the_same_call(dialect):
    arguments = {"city": "São Paulo", "days": 3, "hourly": True}
    content, calls, error = parse_tool_calls(dialect, TOOLS, DIALECT[dialect].render("get_weather", arguments))
    assert error is None and content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", arguments)]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_template_without_tools_gets_them_and_the_past_calls_as_text(dialect):
    messages = with_tools_as_text(CONVERSATION, TOOLS, dialect)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    system = messages[0]["content"]
    assert system.startswith("Be brief.\n\n# Tools") and '"name": "get_weather"' in system
    assert messages[2]["content"] == DIALECT[dialect].render("get_weather", {"city": "Paris"})
    assert "tool_calls" not in messages[2]
    assert messages[3]["content"] == '<tool_response>\n{"temperature": 21}\n</tool_response>'
    prompt = ChatTemplate(CHATML_TEMPLATE).render(messages)
    assert DIALECT[dialect].render("get_weather", {"city": "Paris"}) in prompt


def test_without_a_system_message_the_tools_get_one_of_their_own():
    messages = with_tools_as_text([{"role": "user", "content": "hi"}], TOOLS, "hermes")
    assert messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    assert messages[1] == {"role": "user", "content": "hi"}


def test_a_template_that_reads_tools_gets_the_arguments_as_the_model_wrote_them():
    rendered = ChatTemplate(CHAT_TEMPLATE).render(with_decoded_arguments(CONVERSATION), tools=TOOLS)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert DIALECT["hermes"].render("get_weather", {"city": "Paris"}) in rendered
