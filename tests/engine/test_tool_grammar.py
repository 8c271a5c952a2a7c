"""The tool-call grammar (inference/engine/contract/dialects/grammar.py) in every dialect: a call as the dialect writes
it is a sentence of the `required` grammar and nothing else is (another function, a value its schema refuses, a
missing required parameter, text before the call); `auto` allows free text and keeps a call well formed once it
opens; and random logits sampled under the grammar always give a call that parses and validates. Markup the
tokenizer holds as one token (the demo model's `<tool_call>`) is named as that token, other markup is text
(stories260K)."""

import json
import math

import jsonschema
import llguidance
import pytest
import torch

from inference.engine.contract.dialects.base import DIALECTS
from inference.engine.contract.dialects.grammar import tool_call_grammar
from inference.engine.contract.dialects.registry import DIALECT
from inference.engine.contract.params import SamplingParams
from inference.engine.grammar import GrammarCompiler
from inference.engine.sampler import SequenceSampling, sample_batch
from inference.engine.text.tokenizer import Tokenizer
from tests.engine.digit_model import BOUNDED_NUMBER, digit_runs, numbers_in, write_under
from tests.tool_parsing import parse_tool_calls
from tests.tool_schemas import MEASURE, MEASURE_TOOL, SCHEMAS, TOOLS


@pytest.fixture(scope="module")
def demo_tokenizer(tmp_path_factory):
    from inference.engine.demo_model import write_demo_model

    return Tokenizer.from_hf_dir(write_demo_model(tmp_path_factory.mktemp("demo")))


@pytest.fixture(scope="module", params=["demo", "stories"])
def tokenizer(request, demo_tokenizer, stories_hf_dir):
    return demo_tokenizer if request.param == "demo" else Tokenizer.from_hf_dir(stories_hf_dir)


def compiler_and_tokens(tokenizer, dialect):
    single = frozenset(m for m in DIALECT[dialect].single_tokens if tokenizer.is_added_token(m))
    return GrammarCompiler(tokenizer, tokenizer.vocab_size), single


def continuation_ids(tokenizer, text: str) -> list[int]:
    """`text` as tokens a model may write after a prompt (a SentencePiece `encode` would add a leading space)."""
    view = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=tokenizer.vocab_size)
    return view.tokenize_str(text)


def accepts(tokenizer, dialect, text, **options) -> bool:
    compiler, single = compiler_and_tokens(tokenizer, dialect)
    lark = tool_call_grammar(dialect, TOOLS, single_tokens=single, **options)
    matcher = compiler.matcher(llguidance.LLMatcher.grammar_from_lark(lark))
    ids = continuation_ids(tokenizer, text)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_call_as_the_dialect_writes_it_is_what_required_allows(tokenizer, dialect):
    weather = DIALECT[dialect].render("get_weather", {"city": "Paris", "unit": "celsius", "days": 3})
    assert accepts(tokenizer, dialect, weather, mode="required")
    assert accepts(
        tokenizer, dialect, DIALECT[dialect].render("get_weather", {"city": "Oslo", "days": 1}), mode="required"
    )
    assert accepts(tokenizer, dialect, DIALECT[dialect].render("add", {"a": -2, "b": 25}), mode="required")
    assert not accepts(tokenizer, dialect, DIALECT[dialect].render("nope", {"a": 1, "b": 2}), mode="required")
    assert not accepts(tokenizer, dialect, DIALECT[dialect].render("get_weather", {"city": "Paris", "days": 9}),
                       mode="required")  # fmt: skip
    assert not accepts(tokenizer, dialect, DIALECT[dialect].render("add", {"a": 1}), mode="required")
    assert not accepts(tokenizer, dialect, "Sure! " + weather, mode="required")
    assert not accepts(tokenizer, dialect, "", mode="required")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_named_function_is_the_only_one_allowed(tokenizer, dialect):
    add = DIALECT[dialect].render("add", {"a": 1, "b": 2})
    weather = DIALECT[dialect].render("get_weather", {"city": "Paris", "days": 3})
    assert accepts(tokenizer, dialect, add, mode="required", function="add")
    assert not accepts(tokenizer, dialect, weather, mode="required", function="add")


@pytest.mark.parametrize("dialect", ["hermes", "qwen3_coder", "minicpm"])
def test_auto_allows_text_and_keeps_an_opened_call_well_formed(tokenizer, dialect):
    add = DIALECT[dialect].render("add", {"a": 1, "b": 2})
    assert accepts(tokenizer, dialect, "No call needed, the answer is 3.", mode="auto")
    assert accepts(tokenizer, dialect, f"Let me add them.\n{add}\nDone.", mode="auto")
    broken = DIALECT[dialect].render("add", {"a": "one", "b": 2})
    assert not accepts(tokenizer, dialect, f"Let me add them.\n{broken}", mode="auto")


def test_auto_leaves_the_json_dialect_free_and_no_offered_function_constrains_nothing():
    assert tool_call_grammar("json", TOOLS, mode="auto") is None
    assert tool_call_grammar("hermes", TOOLS, mode="required", function="missing") is None


@pytest.mark.parametrize("dialect", DIALECTS)
def test_random_logits_under_required_always_give_a_valid_call(demo_tokenizer, dialect):
    """The model's preferences are noise here, so only the grammar can make the output a call."""
    tokenizer = demo_tokenizer
    compiler, single = compiler_and_tokens(tokenizer, dialect)
    grammar = llguidance.LLMatcher.grammar_from_lark(
        tool_call_grammar(dialect, TOOLS, mode="required", single_tokens=single)
    )
    eos = tokenizer.eos_token_id
    for seed in range(6):
        sampling = SequenceSampling(SamplingParams(temperature=1.0, seed=seed), tokenizer.vocab_size,
                                    compiler.matcher(grammar))  # fmt: skip
        generator = torch.Generator().manual_seed(seed)
        out = []
        for _ in range(400):
            token = sample_batch(torch.randn(1, tokenizer.vocab_size, generator=generator), [sampling]).token_ids[0]
            if token == eos:
                break
            out.append(token)
        content, calls, error = parse_tool_calls(dialect, TOOLS, tokenizer.decode(out, skip_special_tokens=False))
        assert error is None and content is None and len(calls) == 1, tokenizer.decode(out)
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_model_that_always_writes_digits_completes_a_compelled_call_with_bounded_numbers(tokenizer, dialect):
    """Each number ends at 16 integral digits (16 fractional, a 2-digit exponent; fewer where the schema's maximum
    says so), however much the model wants another digit, so the call completes, every number a finite double."""
    tools = [MEASURE_TOOL]
    compiler, single = compiler_and_tokens(tokenizer, dialect)
    grammar = tool_call_grammar(dialect, tools, mode="required", function="measure", single_tokens=single)
    text, ended = write_under(llguidance.LLMatcher.grammar_from_lark(grammar), tokenizer, budget=400)
    assert ended, text
    content, calls, error = parse_tool_calls(dialect, tools, text)
    assert error is None and content is None and [call.name for call in calls] == ["measure"], text
    arguments = json.loads(calls[0].arguments)
    jsonschema.validate(arguments, MEASURE)
    assert all(math.isfinite(value) for value in arguments.values()), calls[0].arguments
    assert max(digit_runs(text)) == 16 and all(BOUNDED_NUMBER.fullmatch(number) for number in numbers_in(text)), text
