"""Constrained JSON with bounded numbers (inference/engine/contract/json_grammar.py), the grammar response_format's
json_schema and json_object use: a model that always writes a digit where one is allowed still ends every number
(16 integral digits, 16 fractional, a 2-digit exponent) and completes the document, and a schema's minimum and
maximum bound a number tighter; the schema's own meaning is unchanged (the same documents pass and fail as under
llguidance's JSON Schema grammar) and a keyword llguidance cannot enforce still warns."""

import json
from decimal import Decimal

import jsonschema
import llguidance
import pytest

from inference.engine.contract.json_grammar import JSON_LAYOUT, json_schema_lark
from inference.engine.text.tokenizer import Tokenizer
from tests.engine.digit_model import BOUNDED_NUMBER, digit_runs, numbers_in, write_under

NUMBERS = {
    "type": "object",
    "properties": {
        "x": {"type": "number"},
        "n": {"type": "integer"},
        "low": {"type": "number", "minimum": 5},
        "pct": {"type": "number", "minimum": 0, "maximum": 100},
        "list": {"type": "array", "items": {"type": "number", "exclusiveMaximum": -2.5}, "minItems": 2},
        "maybe": {"anyOf": [{"type": "null"}, {"type": "number", "exclusiveMinimum": 0}]},
        "step": {"type": "number", "multipleOf": 0.25},
    },
    "required": ["x", "n", "low", "pct", "list", "maybe", "step"],
}
DOCUMENTS = {  # schema -> documents, each checked against llguidance's own JSON Schema grammar
    json.dumps(NUMBERS): [
        '{"x": 1, "n": 2, "low": 5, "pct": 100, "list": [-3, -2.6], "maybe": null, "step": 1.25}',
        '{"x": -1.5e3, "n": -7, "low": 5.5, "pct": 0.5, "list": [-3, -4], "maybe": 0.1, "step": 2, "extra": [1, {}]}',
        '{"x": 1, "n": 2, "low": 4.99, "pct": 1, "list": [-3, -4], "maybe": null, "step": 1}',
        '{"x": 1, "n": 2, "low": 5, "pct": 100.01, "list": [-3, -4], "maybe": null, "step": 1}',
        '{"x": 1, "n": 2, "low": 5, "pct": 1, "list": [-2.5, -4], "maybe": null, "step": 1}',
        '{"x": 1, "n": 2, "low": 5, "pct": 1, "list": [-3], "maybe": null, "step": 1}',
        '{"x": 1, "n": 2, "low": 5, "pct": 1, "list": [-3, -4], "maybe": 0, "step": 1}',
        '{"x": 1, "n": 2, "low": 5, "pct": 1, "list": [-3, -4], "maybe": null, "step": 1.3}',
        '{"x": 1, "n": 2.5, "low": 5, "pct": 1, "list": [-3, -4], "maybe": null, "step": 1}',
        '{"n": 2, "x": 1, "low": 5, "pct": 1, "list": [-3, -4], "maybe": null, "step": 1}',
        '{"x": 1, "n": 2, "low": 5, "pct": 1, "list": [-3, -4], "maybe": null, "step": 1, "x": 2}',
    ],
    json.dumps({"type": "object"}): ['{}', '{"a": [1, 2.5, "s", true, null, {"b": -0.5e-3}]}', "[]", '{"a": 1,"b": 2}'],
    json.dumps({
        "$defs": {"node": {"type": "object", "properties": {"v": {"type": "number"}, "next": {"$ref": "#/$defs/node"}},
                           "required": ["v"], "additionalProperties": False}},
        "$ref": "#/$defs/node",
    }): ['{"v": 1}', '{"v": 1, "next": {"v": 2.5}}', '{"next": {"v": 2}}', '{"v": 1, "next": {}}'],
    json.dumps({"type": ["number", "string"], "maximum": 3}): ["3", "3.5", '"x"', "null"],
    json.dumps({"properties": {"a": {"type": "integer"}}, "required": ["a"]}): ['{"a": 1}', '{"b": 1}', "7", '"s"'],
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(stories_hf_dir):
    return Tokenizer.from_hf_dir(stories_hf_dir)


@pytest.fixture(scope="module")
def view(tokenizer):
    return llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=tokenizer.vocab_size)


def accepts(view, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(view, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = view.tokenize_str(text)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


def bounded(schema) -> str:
    return llguidance.LLMatcher.grammar_from_lark(json_schema_lark(schema))


@pytest.mark.parametrize("schema", [NUMBERS, {"type": "array"}])  # an array of any values: numbers among them
def test_a_model_that_always_writes_digits_ends_every_number_and_completes(tokenizer, schema):
    text, ended = write_under(bounded(schema), tokenizer, budget=600)
    assert ended, text
    value = json.loads(text)
    jsonschema.validate(value, schema)
    runs = digit_runs(text)
    assert max(runs) == 16, text  # the model wanted more digits: the grammar stopped accepting them after 16
    assert all(BOUNDED_NUMBER.fullmatch(number) for number in numbers_in(text)), text


@pytest.mark.parametrize(
    ("schema", "written"),
    [
        ({"type": "number"}, "9" * 16 + "." + "9" * 16 + "e99"),
        ({"type": "integer"}, "9" * 16),
        ({"type": "integer", "minimum": 400, "maximum": 500}, "500"),
        ({"type": "number", "minimum": 400, "maximum": 500}, "500." + "0" * 16),
        ({"type": "number", "minimum": -20, "maximum": 7.25}, "7.25" + "0" * 14),
        ({"type": "number", "multipleOf": 0.5}, "9" * 16 + ".5"),  # its multipleOf bounds the fraction
        ({"type": "number", "minimum": -1e20}, "9" * 21 + "." + "9" * 16),  # as many digits as its bound has
    ],
)
def test_a_number_has_16_integral_16_fractional_digits_and_a_2_digit_exponent_or_its_bounds_allow_fewer(
    tokenizer, schema, written
):
    text, ended = write_under(bounded(schema), tokenizer, budget=100)
    assert ended and text == written


def test_the_bounds_of_a_number_are_its_minimum_and_maximum_exactly(view):
    """Each bound, inclusive and exclusive, against Decimal's comparison, on numbers around it."""
    bounds = ["0", "5", "-5", "2.5", "-2.5", "0.001", "-0.001", "100", "99.95", "1e-3", "123456.789"]
    near = ["0", "-0", "0.0", "1", "-1", "5", "5.0", "5.00001", "4.99999", "-5", "-5.0", "-4.9", "-5.1", "2.5",
            "2.49", "2.51", "2.500", "-2.5", "-2.51", "-2.49", "0.001", "0.0009", "0.0011", "0.00100", "-0.001",
            "-0.0011", "-0.0009", "100", "100.5", "99.95", "99.949", "99.951", "99", "123456.789", "123456.7889",
            "123456.7891", "123457", "1000000", "-1000000", "0.5", "-0.5"]  # fmt: skip
    for bound in bounds:
        for keyword in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            grammar = bounded({"type": "number", keyword: float(bound)})
            for text in near:
                value, limit = Decimal(text), Decimal(bound)
                expected = {"minimum": value >= limit, "exclusiveMinimum": value > limit,
                            "maximum": value <= limit, "exclusiveMaximum": value < limit}[keyword]  # fmt: skip
                if text.startswith("-") and value == 0:
                    continue  # "-0" is 0 written oddly: neither answer is wrong
                assert accepts(view, grammar, text) == expected, (keyword, bound, text)


@pytest.mark.parametrize("schema", list(DOCUMENTS))
def test_a_schema_passes_and_fails_the_same_documents_as_under_llguidance(view, schema):
    llguidance_own = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    ours = bounded(json.loads(schema))
    for document in DOCUMENTS[schema]:
        assert accepts(view, ours, document) == accepts(view, llguidance_own, document), document


def test_a_keyword_llguidance_cannot_enforce_still_warns():
    unique = {"type": "array", "items": {"type": "number"}, "uniqueItems": True}
    schema = {"type": "object", "properties": {"v": unique}}
    is_error, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(bounded(schema))
    assert not is_error and any("uniqueItems" in warning for warning in warnings)
