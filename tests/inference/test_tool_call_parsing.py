"""Parsing model outputs into tool calls (engine/contract/dialects/parser.py), in each dialect, whole and streamed.

Every output below is written the way a model writes it. Each case is checked parsed whole, and again fed one
character at a time and in every two-piece split: a stream must give the same content, calls and error."""

from __future__ import annotations

import json
import re

import pytest

from inference.engine.contract.dialects.base import DIALECTS
from inference.engine.contract.dialects.parser import ToolCall, ToolCallError, ToolCallParser
from tests.tool_parsing import parse_tool_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
    {
        "type": "function",
        "function": {
            "name": "book_flight",
            "parameters": {
                "type": "object",
                "properties": {
                    "seats": {"type": "integer"},
                    "budget": {"type": "number"},
                    "refundable": {"type": "boolean"},
                    "cabin": {"enum": ["economy", "business"]},
                    "passengers": {"type": "array", "items": {"type": "string"}},
                    "meal": {"type": "object"},
                    "bags": {"type": ["integer", "null"]},
                    "code": {"type": "string"},
                },
            },
        },
    },
]

PARIS = ("get_weather", {"city": "Paris", "days": 3})
TIME = ("get_time", {"zone": "CET"})
FLIGHT = (
    "book_flight",
    {
        "seats": 2,
        "budget": 199.5,
        "refundable": True,
        "cabin": "business",
        "passengers": ["Ann", "Bob"],
        "meal": {"kind": "veg", "extra": [1, 2]},
        "bags": None,
        "code": "007",
        "note": 42,
        "remark": "hello there",
    },
)


def error(code: str, function: str | None = None, parameter: str | None = None) -> tuple:
    return code, function, parameter


# (output, content, [(name, arguments)], (code, function, parameter) or None), per dialect.
CASES = {
    "hermes": {
        "single": (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
            None,
            [PARIS],
            None,
        ),
        "parallel": (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
            "And the time:\n"
            '<tool_call>\n{"name": "get_time", "parameters": {"zone": "CET"}}\n</tool_call>',
            "And the time:",
            [PARIS, TIME],
            None,
        ),
        "text around": (
            "Let me check.\n\n"
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n\n'
            "One moment.",
            "Let me check.\n\nOne moment.",
            [PARIS],
            None,
        ),
        "arguments as JSON text": (
            '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"days\\": 3}"}'
            "\n</tool_call>",
            None,
            [PARIS],
            None,
        ),
        "malformed": (
            'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
            "Checking.",
            [],
            error("malformed_call"),
        ),
        "unknown function": (
            '<tool_call>\n{"name": "get_stock", "arguments": {"ticker": "ACME"}}\n</tool_call>',
            "",
            [],
            error("unknown_function", "get_stock"),
        ),
        "invalid arguments": (
            '<tool_call>\n{"name": "get_weather", "arguments": ["Paris"]}\n</tool_call>',
            "",
            [],
            error("invalid_arguments", "get_weather"),
        ),
        "first error kept, later call parsed": (
            '<tool_call>\n{"name": "get_weather", "arguments": "Paris"}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_stock"}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
            None,
            [TIME],
            error("invalid_arguments", "get_weather"),
        ),
        "unfinished": (
            'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"ci',
            "Sure.",
            [],
            error("unfinished_call", "get_weather"),
        ),
        "plain text": ("The weather is fine.\n", "The weather is fine.\n", [], None),
        "angle brackets": ("if a < b and <tool or <tool_calls> ", "if a < b and <tool or <tool_calls> ", [], None),
    },
    "qwen3_coder": {
        "single": (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            None,
            [PARIS],
            None,
        ),
        "parallel": (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\nand\n"
            "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>",
            "and",
            [PARIS, TIME],
            None,
        ),
        "text around": (
            "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\nDone.\n",
            "Let me check.\nDone.",
            [PARIS],
            None,
        ),
        "typed by schema": (
            "<tool_call>\n<function=book_flight>\n"
            "<parameter=seats>\n2\n</parameter>\n<parameter=budget>\n199.5\n</parameter>\n"
            "<parameter=refundable>\ntrue\n</parameter>\n<parameter=cabin>\nbusiness\n</parameter>\n"
            '<parameter=passengers>\n["Ann", "Bob"]\n</parameter>\n'
            '<parameter=meal>\n{"kind": "veg", "extra": [1, 2]}\n</parameter>\n'
            "<parameter=bags>\nnull\n</parameter>\n<parameter=code>\n007\n</parameter>\n"
            "<parameter=note>\n42\n</parameter>\n<parameter=remark>\nhello there\n</parameter>\n"
            "</function>\n</tool_call>",
            None,
            [FLIGHT],
            None,
        ),
        "one newline stripped each side": (
            "<tool_call><function=get_weather><parameter=city>\n\n Paris \n\n</parameter></function></tool_call>",
            None,
            [("get_weather", {"city": "\n Paris \n"})],
            None,
        ),
        "no parameters": (
            "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
            None,
            [("get_time", {})],
            None,
        ),
        "malformed": (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
            "",
            [],
            error("malformed_call"),
        ),
        "stray text among parameters": (
            "<tool_call>\n<function=get_weather>\nhmm\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
            "",
            [],
            error("malformed_call"),
        ),
        "unknown function": (
            "<tool_call>\n<function=get_stock>\n<parameter=ticker>\nACME\n</parameter>\n</function>\n</tool_call>",
            "",
            [],
            error("unknown_function", "get_stock"),
        ),
        "invalid arguments": (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\nabc\n</parameter>\n</function>\n</tool_call>",
            "",
            [],
            error("invalid_arguments", "get_weather", "days"),
        ),
        "float for an integer": (
            "<tool_call>\n<function=book_flight>\n<parameter=seats>\n2.5\n</parameter>\n</function>\n</tool_call>",
            "",
            [],
            error("invalid_arguments", "book_flight", "seats"),
        ),
        "text for an object": (
            "<tool_call>\n<function=book_flight>\n<parameter=meal>\n[1]\n</parameter>\n</function>\n</tool_call>",
            "",
            [],
            error("invalid_arguments", "book_flight", "meal"),
        ),
        "unfinished": (
            "Looking it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
            "Looking it up.",
            [],
            error("unfinished_call", "get_weather"),
        ),
        "unfinished before the name": ("Hm <tool_call>\n<function=get_w", "Hm", [], error("unfinished_call")),
        "plain text": ("Paris is sunny today.", "Paris is sunny today.", [], None),
        "angle brackets": ("a < b, <tool_call is a tag, <b>", "a < b, <tool_call is a tag, <b>", [], None),
    },
    "minicpm": {
        "single": (
            '<function name="get_weather"><param name="city">Paris</param><param name="days">3</param></function>',
            None,
            [PARIS],
            None,
        ),
        "parallel": (
            '<function name="get_weather"><param name="city">Paris</param><param name="days">3</param></function>\n'
            "then\n"
            '<function name="get_time">\n<param name="zone">CET</param>\n</function>',
            "then",
            [PARIS, TIME],
            None,
        ),
        "text around": (
            'Checking. <function name="get_weather"><param name="city">Paris</param>'
            '<param name="days">3</param></function> Back soon.',
            "Checking. Back soon.",
            [PARIS],
            None,
        ),
        "typed by schema": (
            '<function name="book_flight"><param name="seats">2</param><param name="budget">199.5</param>'
            '<param name="refundable">true</param><param name="cabin">business</param>'
            '<param name="passengers">["Ann", "Bob"]</param><param name="meal">{"kind": "veg", "extra": [1, 2]}</param>'
            '<param name="bags">null</param><param name="code">007</param><param name="note">42</param>'
            '<param name="remark">hello there</param></function>',
            None,
            [FLIGHT],
            None,
        ),
        "malformed": (
            '<function name="get_weather"><param name="city">Paris</function>',
            "",
            [],
            error("malformed_call"),
        ),
        "unknown function": (
            '<function name="get_stock"><param name="ticker">ACME</param></function>',
            "",
            [],
            error("unknown_function", "get_stock"),
        ),
        "invalid arguments": (
            '<function name="book_flight"><param name="refundable">maybe</param></function>',
            "",
            [],
            error("invalid_arguments", "book_flight", "refundable"),
        ),
        "unfinished": (
            'On it. <function name="get_weather"><param name="city">Pa',
            "On it.",
            [],
            error("unfinished_call", "get_weather"),
        ),
        "plain text": ("No tools needed.", "No tools needed.", [], None),
        "angle brackets": (
            "x < y and <function> or <function name=x>",
            "x < y and <function> or <function name=x>",
            [],
            None,
        ),
    },
    "json": {
        "single": ('{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}', None, [PARIS], None),
        "fenced, text around": (
            'I will check.\n```json\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n```\nDone.',
            "I will check.\nDone.",
            [PARIS],
            None,
        ),
        "plain fence": (
            '```\n{"function": "get_time", "arguments": {"zone": "CET"}}\n```',
            None,
            [TIME],
            None,
        ),
        "parallel, one a line": (
            '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\nthen\n'
            '  {"function": "get_time", "arguments": {"zone": "CET"}}\n',
            "then",
            [PARIS, TIME],
            None,
        ),
        "two calls in one fence": (
            '```json\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
            '{"name": "get_time", "arguments": {"zone": "CET"}}\n```',
            None,
            [PARIS, TIME],
            None,
        ),
        "fence left open": (
            '```json\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n',
            None,
            [PARIS],
            None,
        ),
        "arguments as JSON text": (
            '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"days\\": 3}"}',
            None,
            [PARIS],
            None,
        ),
        "braces inside strings": (
            '{"name": "get_time", "arguments": {"zone": "}\\"{```\\n}"}}',
            None,
            [("get_time", {"zone": '}"{```\n}'})],
            None,
        ),
        "plain JSON object": (
            'Here is the data:\n{"city": "Paris", "days": 3}\nAll done.',
            'Here is the data:\n{"city": "Paris", "days": 3}\nAll done.',
            [],
            None,
        ),
        "fenced plain JSON": ('```json\n{"name": 3}\n```\n', '```json\n{"name": 3}\n```\n', [], None),
        "code fence": (
            "```python\nprint({1: 2})\n```\nand\n```\nx = {}\n```",
            "```python\nprint({1: 2})\n```\nand\n```\nx = {}\n```",
            [],
            None,
        ),
        "call mid-line is content": (
            'Calls look like {"name": "get_time", "arguments": {}} here.',
            'Calls look like {"name": "get_time", "arguments": {}} here.',
            [],
            None,
        ),
        "braces in prose": (
            "use {braces} here\n{braces} at a line start\n{ and one never closed",
            "use {braces} here\n{braces} at a line start\n{ and one never closed",
            [],
            None,
        ),
        "malformed": (
            'Checking.\n{"name": "get_weather", "arguments": {"city": Paris}}',
            "Checking.",
            [],
            error("malformed_call"),
        ),
        "unknown function": (
            '{"name": "get_stock", "arguments": {"ticker": "ACME"}}',
            "",
            [],
            error("unknown_function", "get_stock"),
        ),
        "invalid arguments": (
            '{"name": "get_weather", "arguments": "Paris"}',
            "",
            [],
            error("invalid_arguments", "get_weather"),
        ),
        "not-a-number arguments": (
            '{"name": "get_weather", "arguments": {"days": NaN}}',
            "",
            [],
            error("malformed_call"),
        ),
        "unfinished": (
            'Checking.\n{"name": "get_weather", "arguments": {"city": "Par',
            "Checking.",
            [],
            error("unfinished_call", "get_weather"),
        ),
        "unfinished in a fence": (
            'Checking.\n```json\n{"name": "get_wea',
            "Checking.",
            [],
            error("unfinished_call"),
        ),
        "plain text": ("It is sunny.\n\n", "It is sunny.\n\n", [], None),
    },
}

ALL_CASES = [
    pytest.param(dialect, *case, id=f"{dialect}: {name}")
    for dialect, cases in CASES.items()
    for name, case in cases.items()
]


def outcome(calls: list[ToolCall], parsed_error: ToolCallError | None) -> tuple:
    """What a client sees of the calls and error, less the ids (random per call)."""
    named = [(call.name, json.loads(call.arguments)) for call in calls]
    code = parsed_error and (parsed_error.code, parsed_error.function, parsed_error.parameter)
    return named, code


def streamed(dialect: str, pieces: list[str]) -> tuple:
    parser = ToolCallParser(dialect, TOOLS)
    content, calls = [], []
    for piece in [*pieces, None]:
        text, completed = parser.push(piece) if piece is not None else parser.flush()
        content.append(text)
        calls += completed
    assert calls == parser.calls
    return "".join(content), *outcome(parser.calls, parser.error)


@pytest.mark.parametrize(("dialect", "output", "content", "calls", "code"), ALL_CASES)
def test_whole_output(dialect, output, content, calls, code):
    parsed_content, parsed_calls, parsed_error = parse_tool_calls(dialect, TOOLS, output)
    assert parsed_content == content
    assert outcome(parsed_calls, parsed_error) == (calls, code)


@pytest.mark.parametrize(("dialect", "output", "content", "calls", "code"), ALL_CASES)
def test_any_split_gives_the_same_result(dialect, output, content, calls, code):
    whole = (content or "", calls, code)
    assert streamed(dialect, list(output)) == whole
    for cut in range(1, len(output)):
        assert streamed(dialect, [output[:cut], output[cut:]]) == whole, f"split at {cut}"


def test_every_dialect_has_a_parser():
    for dialect in DIALECTS:
        assert parse_tool_calls(dialect, TOOLS, "hi") == ("hi", [], None)
    with pytest.raises(ValueError):
        ToolCallParser("yaml", TOOLS)


def test_content_before_a_call_is_released_at_once():
    parser = ToolCallParser("hermes", TOOLS)
    assert parser.push("Let me look. <tool") == ("Let me look.", [])
    assert parser.push('_call>\n{"name": "get_time", "argu') == ("", [])
    text, calls = parser.push('ments": {}}\n</tool_call>\n')
    assert (text, [call.name for call in calls]) == ("", ["get_time"])
    assert parser.push("\nDone") == (" Done", [])  # the space before the call separates the text around it
    assert parser.flush() == ("", [])


def test_held_text_that_is_no_opener_is_released():
    parser = ToolCallParser("minicpm", TOOLS)
    assert parser.push("a <func") == ("a", [])
    assert parser.push("tion> b ") == (" <function> b", [])
    assert parser.flush() == (" ", [])


def test_json_object_at_a_line_start_is_held_until_it_closes():
    parser = ToolCallParser("json", TOOLS)
    assert parser.push('Plan:\n{"name": "get_time",') == ("Plan:", [])
    text, calls = parser.push(' "arguments": {}}')
    assert (text, [call.name for call in calls]) == ("", ["get_time"])
    parser = ToolCallParser("json", TOOLS)
    assert parser.push('Data:\n{"a": 1') == ("Data:", [])
    assert parser.push("}") == ('\n{"a": 1}', [])
    parser = ToolCallParser("json", TOOLS)
    assert parser.push("Set:\n{ x") == ("Set:\n{ x", [])  # braces around prose are no JSON object
    parser = ToolCallParser("json", TOOLS)
    assert parser.push("```\nx = 1") == ("```\nx = 1", [])  # a code fence is released once it holds no object


def test_call_bodies_and_unique_ids():
    output = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
    )
    calls = parse_tool_calls("hermes", TOOLS, output)[1] + parse_tool_calls("hermes", TOOLS, output)[1]
    assert calls[0].body() == {
        "id": calls[0].id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Zürich"}'},
    }
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", call.id) for call in calls)
    assert len({call.id for call in calls}) == 4


def test_error_body_names_only_what_is_known():
    output = "<tool_call>\n<function=get_weather>\n<parameter=days>\nabc\n</parameter>\n</function>\n</tool_call>"
    body = parse_tool_calls("qwen3_coder", TOOLS, output)[2].body()
    assert body.keys() == {"code", "message", "function", "parameter"}
    assert (body["code"], body["function"], body["parameter"]) == ("invalid_arguments", "get_weather", "days")
    assert body["message"]
    assert parse_tool_calls("hermes", TOOLS, "<tool_call>oops</tool_call>")[2].body().keys() == {"code", "message"}
