"""Constrained sampling (inference/engine/grammar.py, sampler.py): in one batch a row with a grammar samples only
what its grammar allows, until the grammar is complete and only EOS is left, while a free row beside it samples
exactly what it samples alone; compiled grammars are shared but every request starts from the start state."""

import json

import llguidance
import pytest
import torch

from inference.engine.contract.params import SamplingParams
from inference.engine.grammar import GrammarCompiler, GrammarError
from inference.engine.sampler import SequenceSampling, sample_batch
from inference.engine.text.tokenizer import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "c": {"enum": ["red", "blue"]}},
    "required": ["n", "c"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(stories_hf_dir):
    return Tokenizer.from_hf_dir(stories_hf_dir)


@pytest.fixture(scope="module")
def grammar():
    options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    return llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=options)


def test_a_constrained_row_follows_its_grammar_and_the_free_rows_around_it_are_untouched(tokenizer, grammar):
    """The constrained row sits between two free ones: a mask that lands on any other row than its own shows."""
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size)
    params = SamplingParams(temperature=1.0, seed=5)
    constrained = SequenceSampling(params, tokenizer.vocab_size, compiler.matcher(grammar))
    free = [SequenceSampling(params, tokenizer.vocab_size) for _ in range(2)]
    alone = [SequenceSampling(params, tokenizer.vocab_size) for _ in range(2)]
    generator = torch.Generator().manual_seed(0)
    out, free_tokens, alone_tokens = [], [], []
    for _ in range(100):
        logits = torch.randn(3, tokenizer.vocab_size, generator=generator)
        batch = sample_batch(logits, [free[0], constrained, free[1]])
        alone_tokens.append([sample_batch(logits[row : row + 1].clone(), [alone[i]]).token_ids[0]
                             for i, row in enumerate((0, 2))])  # fmt: skip
        free_tokens.append([batch.token_ids[0], batch.token_ids[2]])
        if batch.token_ids[1] == tokenizer.eos_token_id:
            break
        out.append(batch.token_ids[1])
    assert free_tokens == alone_tokens
    value = json.loads(tokenizer.decode(out))
    assert set(value) == {"n", "c"} and 0 <= value["n"] <= 99 and value["c"] in ("red", "blue")
    assert constrained.grammar.is_accepting()


def test_each_request_starts_from_the_start_state(tokenizer, grammar):
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size)
    first = SequenceSampling(SamplingParams(temperature=1.0, seed=1), tokenizer.vocab_size, compiler.matcher(grammar))
    start = first.grammar.compute_bitmask()
    for _ in range(4):
        sample_batch(torch.zeros(1, tokenizer.vocab_size), [first])
    assert first.grammar.compute_bitmask() != start  # the first request moved on
    assert compiler.matcher(grammar).compute_bitmask() == start  # the next one starts from the start


def test_a_grammar_that_does_not_compile_is_an_error(tokenizer):
    with pytest.raises(GrammarError):
        GrammarCompiler(tokenizer, tokenizer.vocab_size).matcher('{"grammars": [{"lark_grammar": "start: ("}]}')


def test_the_exempt_token_may_come_first_unseen_by_the_grammar_and_only_first(tokenizer, grammar):
    """The constrained row is the second of the batch, after a free one that prefers the same token."""
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size)
    state = SequenceSampling(SamplingParams(temperature=0), tokenizer.vocab_size, compiler.matcher(grammar))
    free = SequenceSampling(SamplingParams(temperature=0), tokenizer.vocab_size)
    start = state.grammar.compute_bitmask()
    exempt = tokenizer.encode("Once", add_special_tokens=False)[-1]  # no JSON starts with it
    logits = torch.zeros(2, tokenizer.vocab_size)
    logits[:, exempt] = 50.0
    state.grammar_exempt = exempt
    assert sample_batch(logits.clone(), [free, state]).token_ids == [exempt, exempt]
    assert state.grammar.compute_bitmask() == start and not state.grammar.is_error()  # the grammar did not see it
    second = sample_batch(logits.clone(), [free, state]).token_ids
    assert second[0] == exempt and second[1] != exempt  # from the second token on, the grammar rules its row
