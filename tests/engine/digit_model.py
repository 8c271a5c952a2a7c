"""A model that loves digits, for the grammars' number bounds: greedy over logits that rank every token made of
digits first (longer ones higher, then the larger first digit), then `.`, then `e`, then what closes a string, object
or array, then the rest by noise. Under a grammar it writes each number as long as the grammar lets it: an unbounded
number never ends."""

import re

import torch

from inference.engine.contract.params import SamplingParams
from inference.engine.grammar import GrammarCompiler
from inference.engine.sampler import SequenceSampling, sample_batch
from inference.engine.text.tokenizer import Tokenizer

NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")  # a JSON number, however long
# A number as contract/json_grammar.py bounds it: 16 integral and 16 fractional digits, a 2-digit exponent.
BOUNDED_NUMBER = re.compile(r"-?\d{1,16}(\.\d{1,16})?([eE][+-]?\d{1,2})?")


def digit_loving_logits(tokenizer: Tokenizer, seed: int = 0) -> torch.Tensor:
    """[1, V] logits of the model described above (its noise from `seed`)."""
    logits = torch.randn(1, tokenizer.vocab_size, generator=torch.Generator().manual_seed(seed))
    for token in range(tokenizer.vocab_size):
        text = tokenizer.decode([token])
        if text.isdigit():
            logits[0, token] = 40 + len(text) + int(text[0]) / 10
        elif text in (".", "e"):
            logits[0, token] = {".": 30, "e": 20}[text]
        elif text in ('"', "}", "]"):
            logits[0, token] = 10
    return logits


def digit_bias(tokenizer: Tokenizer, bias: float = 30.0) -> dict[str, float]:
    """A request's `logit_bias` that makes a random-weight model love digits as above: every token made of the
    digits 1 to 9 (a number that starts with 0 ends at once)."""
    return {
        str(token): bias
        for token in range(tokenizer.vocab_size)
        if (text := tokenizer.decode([token])).isdigit() and "0" not in text
    }


def write_under(grammar: str, tokenizer: Tokenizer, *, budget: int, seed: int = 0) -> tuple[str, bool]:
    """The text the digit-loving model writes under `grammar` (llguidance's grammar JSON) and whether it ended (EOS)
    within `budget` tokens."""
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size)
    sampling = SequenceSampling(SamplingParams(temperature=0), tokenizer.vocab_size, compiler.matcher(grammar))
    logits = digit_loving_logits(tokenizer, seed)
    out: list[int] = []
    for _ in range(budget):
        token = sample_batch(logits.clone(), [sampling]).token_ids[0]
        if token == tokenizer.eos_token_id:
            return tokenizer.decode(out, skip_special_tokens=False), True
        out.append(token)
    return tokenizer.decode(out, skip_special_tokens=False), False


def digit_runs(text: str) -> list[int]:
    """The lengths of the runs of digits in `text`."""
    return [len(run) for run in re.findall(r"\d+", text)]


def numbers_in(text: str) -> list[str]:
    """The numbers written in `text`, as written."""
    return [match.group() for match in NUMBER.finditer(text)]
