"""One generation as the scheduler sees it: prompt, output so far, where its KV lives, and when it must stop.

A sequence turns sampled token ids into the text a client may see. Stop strings are matched on that text, across
token boundaries: text that could be the start of a stop string is held back until the next token decides, so a
client never receives part of a stop string, and the stop string itself is never sent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from inference.engine.contract.messages import TokenLogprob
from inference.engine.contract.params import GenerationOptions, Priority
from inference.engine.repetition import RepetitionDetector
from inference.engine.sampler import SequenceSampling
from inference.engine.text.detokenizer import IncrementalDetokenizer
from inference.engine.think_block import ThinkBlock

if TYPE_CHECKING:
    import llguidance

    from inference.engine.kv.sessions import Conversation, Session

STOP = "stop"
LENGTH = "length"
REPETITION_LOOP = "repetition_loop"


class Sequence:
    """A request's tokens and stop conditions. `slot` is its KV-cache slot while it runs, else None. A turn of a
    session carries its `session` and, once running, the `conversation` it continues (sessions.py); after its
    finish it stays `finalizing` for one step, which writes its last token's KV so the next turn finds it.

    `context_window` is the context window: prompt and output together never exceed it, and a generation that reaches
    it ends with finish_reason "length", as one that reaches `options.max_tokens` does. It stops at the request's
    stop strings and tokens and at the model's `eos_token_ids` (unless `options.ignore_eos`), none of them before
    `options.min_tokens` tokens. With a `repetition` detector (the
    scheduler arms one), a generation whose output ends in a loop ends with finish_reason "repetition_loop".
    A `priority` "batch" sequence is a batch's line: the scheduler runs it only in what interactive ones leave.
    """

    __slots__ = (
        "request_id", "prompt_ids", "output_ids", "sampling", "detokenizer", "options", "stop_token_ids", "stop",
        "context_window", "slot", "num_prefilled", "cached_tokens", "finish_reason",
        "arrival", "token_at", "_held",
        "session_id", "session", "conversation", "session_conflict", "finalizing", "think", "deferred_grammar",
        "token_text", "unspelled", "released_chars", "spelled_chars", "prompt_logprobs", "prompt_entries",
        "repetition", "priority",
    )  # fmt: skip

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        *,
        sampling: SequenceSampling | None,
        detokenizer: IncrementalDetokenizer,
        options: GenerationOptions,
        eos_token_ids: Iterable[int] = (),
        prompt_logprobs: int | None = None,
        context_window: int,
        arrival: float = 0.0,
        session_id: str | None = None,
        priority: Priority = "interactive",
    ):
        if not prompt_ids:
            raise ValueError("a sequence needs at least one prompt token")
        self.request_id = request_id
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.sampling = sampling  # the sampler's per-sequence state (parameters, seed, penalty counts)
        self.detokenizer = detokenizer
        self.options = options
        ending = () if options.ignore_eos else eos_token_ids
        self.stop_token_ids = frozenset(options.stop_token_ids).union(ending)
        self.stop = [s for s in options.stop if s]
        if options.min_tokens and sampling is not None:  # stop tokens are refused until this many tokens are out
            sampling.refuse(self.stop_token_ids)
        self.context_window = context_window
        # With prompt_logprobs (alternatives per position), each prompt token's log-probability given those before
        # it, filled as the prompt is prefilled (the prompt is then computed whole: no cached prefix is reused).
        self.prompt_logprobs = prompt_logprobs
        self.prompt_entries: list[TokenLogprob] = []
        self.slot: int | None = None
        self.num_prefilled = 0  # prompt tokens whose KV is in the slot
        self.cached_tokens = 0  # prompt tokens whose KV was reused rather than computed
        self.finish_reason: str | None = None
        self.arrival = arrival
        self.token_at = 0.0  # when its last token was appended (serving_metrics.py); 0: none yet
        self._held = ""  # released text that might be the start of a stop string
        self.session_id = session_id  # the session the request names; `session` once admitted under it
        self.session: Session | None = None
        self.conversation: Conversation | None = None
        self.session_conflict = False
        self.finalizing = False
        self.token_text = ""  # the text the last appended token added to the decoded output (before stop strings)
        # Logprob entries wait here until the text they spell is released (a stop string may still cut it):
        self.unspelled: deque[TokenLogprob] = deque()
        self.released_chars = 0  # characters of text released to the client
        self.spelled_chars = 0  # of those, the characters the logprob entries sent so far spell
        self.think: ThinkBlock | None = None  # the think block and its budget, for a chat on a think-style template
        self.deferred_grammar: llguidance.LLMatcher | None = None  # the answer's grammar, while the prompt's think
        # block is open (the reasoning is free); it moves to `sampling.grammar` when the block closes
        self.repetition: RepetitionDetector | None = None  # None: a loop runs on to options.max_tokens
        self.priority = priority  # "batch": yields to interactive sequences (scheduler.py)

    def defer_grammar(self) -> None:
        """Holds the grammar back while the prompt's think block is open (the reasoning is free); the turn cannot
        end meanwhile, since the grammar's answer must still come."""
        self.deferred_grammar, self.sampling.grammar = self.sampling.grammar, None
        self.sampling.refuse(self.stop_token_ids)

    def arm_deferred_grammar(self) -> None:
        """The think block closed: the answer follows the grammar, which decides when it may end."""
        self.sampling.grammar, self.deferred_grammar = self.deferred_grammar, None
        if len(self.output_ids) >= self.options.min_tokens:
            self.sampling.allow(self.stop_token_ids)

    @property
    def grammar(self) -> llguidance.LLMatcher | None:
        """The matcher of the grammar the output must follow (None: free), whether it applies yet or not."""
        if self.deferred_grammar is not None:
            return self.deferred_grammar
        return None if self.sampling is None else self.sampling.grammar

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefill_done(self) -> bool:
        return self.num_prefilled == len(self.prompt_ids)

    @property
    def last_token(self) -> int:
        """The token the next decode step feeds (its KV is not in the slot yet)."""
        return self.output_ids[-1]

    def next_chunk(self, size: int) -> list[int]:
        """The next at most `size` prompt tokens to prefill; the caller marks them done with `num_prefilled`."""
        return self.prompt_ids[self.num_prefilled : self.num_prefilled + size]

    def append_token(self, token_id: int) -> str:
        """Records a sampled token; returns the text it releases to the client (possibly empty).

        Sets `finish_reason` when the token is a stop token, completes a stop string, closes a repetition loop, or
        uses up `max_tokens` or the context window, in that order of precedence. On finishing, everything still held
        back is released (cut before a stop string).
        """
        if self.is_finished:
            raise RuntimeError(f"sequence {self.request_id} already finished ({self.finish_reason})")
        self.output_ids.append(token_id)
        if (
            len(self.output_ids) == self.options.min_tokens
            and self.deferred_grammar is None
            and self.sampling is not None
        ):
            self.sampling.allow(self.stop_token_ids)  # min_tokens reached: the answer may end from here
        if token_id in self.stop_token_ids:
            self.finish_reason = STOP
            self.token_text = ""
            return self._release(self.detokenizer.flush(), final=True)
        self.token_text = self.detokenizer.push(token_id)
        text = self._release(self.token_text, final=False)
        if not self.is_finished:
            if self.repetition is not None and self.repetition.push(token_id):
                self.finish_reason = REPETITION_LOOP
            elif len(self.output_ids) >= self.options.max_tokens or self.num_tokens >= self.context_window:
                self.finish_reason = LENGTH
            if self.is_finished:
                rest = self.detokenizer.flush()
                self.token_text += rest
                text += self._release(rest, final=True)
        return text

    def spell(self, entry: TokenLogprob | None, released: str) -> list[TokenLogprob]:
        """The logprob entries to send with `released` (the text append_token just released), after queueing the
        newest token's `entry` (None for a stop token, which adds no text). An entry goes out once all of its text
        is released, so the entries sent always spell the text sent; when the sequence finished, the entry a stop
        string cut is cut with it and the entries wholly past the cut are dropped."""
        if entry is not None:
            self.unspelled.append(entry)
        self.released_chars += len(released)
        out = []
        while self.unspelled and self.spelled_chars + len(self.unspelled[0].text) <= self.released_chars:
            out.append(self.unspelled.popleft())
            self.spelled_chars += len(out[-1].text)
        if self.is_finished and self.unspelled:
            cut = self.unspelled.popleft()
            room = self.released_chars - self.spelled_chars
            cut.text = cut.text[:room]
            self.spelled_chars += room
            out.append(cut)
            self.unspelled.clear()
        return out

    def _release(self, new_text: str, *, final: bool) -> str:
        """Adds `new_text` after the held text and returns what may be sent now."""
        text = self._held + new_text
        self._held = ""
        hit = _first_stop(text, self.stop)
        if hit >= 0:
            self.finish_reason = STOP
            return text[:hit]
        if final or not self.stop:
            return text
        keep = _stop_prefix_length(text, self.stop)
        if keep:
            self._held = text[-keep:]
            return text[:-keep]
        return text


def _first_stop(text: str, stops: list[str]) -> int:
    """Where the earliest stop string starts in `text`, or -1."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits, default=-1)


def _stop_prefix_length(text: str, stops: list[str]) -> int:
    """The length of the longest end of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
