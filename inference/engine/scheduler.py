"""The per-model scheduler: which sequences run, and one engine step for all of them.

Sequences wait in a FIFO queue until a decode slot is free, then run until they finish or are aborted. Each step
is planned by `schedule()` (nano-vllm style): at most one chunk's worth of prompt tokens (`prefill_chunk`, taken
from the oldest running sequences whose prompt is not in the KV yet) plus one token for every sequence that has one
to feed. `step()` runs the plan as one forward pass (ModelRunner.step: prompt chunks and decode rows share each pass
over the weights) and makes a single sampler call for all rows that produced logits;
`postprocess()` appends the tokens. A long prompt therefore stalls running decoders by at most one chunk per step,
and a sequence joins or leaves the batch at any step. `pause()` stops admitting at a step boundary; running
sequences finish first.

Two lines wait for slots: interactive sequences (a client is waiting) and batch ones (`priority` "batch": a batch's
lines). A free slot goes to the oldest interactive sequence; a batch one gets it only when no interactive one waits
and fewer than `batch_slots` batch sequences run, and interactive prompts take a step's prefill budget first. Each
line has its own `queue_depth` places (batch ones beyond the `batch_slots` they may run in), so waiting batch
sequences never make an interactive request `queue_full`. Only interactive sequences are refused for waiting too
long (`queue_timeout`): a batch line has no client watching the clock, and refusing it would only send it to the
back of the line again (its runner retries what is refused).

A sequence admitted to a slot starts from whatever KV it can reuse: the conversation its session turn continues,
else the cached blocks its prompt begins with (kv_cache.py, sessions.py); only the rest is prefilled, and
`cached_tokens` reports what was reused. A finished session turn decodes once more, without sampling, so the KV of
its last token is kept too (`finalizing`); its FINISHED goes out at once.

A step returns plain results (step_results.py: admitted, streamed, ended, expired), in order; the worker turns them
into the protocol's messages.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from inference.engine.contract.messages import TokenLogprob, TopLogprob
from inference.engine.contract.params import Priority
from inference.engine.execution.runner import ModelRunner
from inference.engine.kv.sessions import SessionTable
from inference.engine.repetition import RepetitionDetector
from inference.engine.sampler import SampledTokens, TokenLogprobs, sample_batch
from inference.engine.sequence import Sequence
from inference.engine.serving_metrics import ModelMetrics
from inference.engine.step_results import Admitted, Ended, Expired, StepResult, Streamed
from inference.engine.text.detokenizer import IncrementalDetokenizer
from inference.engine.text.tokenizer import Tokenizer


@dataclass(slots=True)
class StepPlan:
    """One step's work: sequences admitted to a slot, prefill chunks (`prefill_chunk` tokens in all), and the batch
    to decode."""

    admitted: list[Sequence]
    prefills: list[tuple[Sequence, list[int]]]  # (sequence, its next prompt tokens), interactive then oldest first
    decode: list[Sequence]


class Scheduler:
    """Owns a model's running and waiting sequences and their KV slots.

    `max_concurrent` sequences run (decode) at once, at most the runner's slot count, of them at most `batch_slots`
    batch-priority ones (None: any); `queue_depth` more of each priority may wait (see the module docstring); an
    interactive one that waits longer than `queue_timeout` seconds is refused (queue_timeout). Every sequence added
    gets a detector of loops over its last `repetition_span` tokens (repetition.py; 0: none), so a decode stuck
    repeating itself ends with finish_reason "repetition_loop" rather than running on to `max_tokens`.
    """

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Tokenizer,
        *,
        max_concurrent: int = 1,
        batch_slots: int | None = None,
        queue_depth: int = 0,
        queue_timeout: float = 30.0,
        prefill_chunk: int = 128,
        repetition_span: int = 0,
        sessions: SessionTable | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: ModelMetrics | None = None,
    ):
        if not 1 <= max_concurrent <= runner.max_concurrent:
            raise ValueError(
                f"max_concurrent {max_concurrent} must be in [1, {runner.max_concurrent}] (what the KV pool holds)"
            )
        self.runner = runner
        self.tokenizer = tokenizer
        self.max_concurrent = max_concurrent
        self.batch_slots = max_concurrent if batch_slots is None else batch_slots
        if not 1 <= self.batch_slots <= max_concurrent:
            raise ValueError(f"batch_slots {self.batch_slots} must be in [1, max_concurrent {max_concurrent}]")
        self.queue_depth = queue_depth
        self.queue_timeout = queue_timeout
        self.prefill_chunk = prefill_chunk
        self.repetition_span = repetition_span
        self.clock = clock
        self.metrics = metrics  # what a worker records of this model (serving_metrics.py); None: nothing
        self.sessions = sessions  # None: session ids are ignored (every turn still reuses cached prefixes)
        self.queues: dict[Priority, deque[Sequence]] = {"interactive": deque(), "batch": deque()}  # FIFO each
        self.running: list[Sequence] = []
        self.paused = False
        self.forward_steps = 0  # forward passes run so far (the weights barrier shows none runs while it holds)
        self.prefill_tok_per_s = 0.0  # measured: tokens per second of steps that prefill, a moving average

    @property
    def context_window(self) -> int:
        """The context window every sequence of this model gets (the KV cache's length)."""
        return self.runner.context_window

    @property
    def waiting(self) -> list[Sequence]:
        """Every waiting sequence, interactive ones first (a copy: `num_waiting` only counts them)."""
        return [*self.queues["interactive"], *self.queues["batch"]]

    def num_waiting(self) -> int:
        return len(self.queues["interactive"]) + len(self.queues["batch"])

    @property
    def has_work(self) -> bool:
        return bool(self.running) or (not self.paused and any(self.queues.values()))

    def batch_running(self) -> int:
        """Running batch-priority sequences (finalizing ones hold their slot for the step they have left)."""
        return sum(seq.priority == "batch" for seq in self.running)

    def is_full(self, priority: Priority = "interactive") -> bool:
        """Whether one more sequence of `priority` would be refused: every slot it may run in and every place of its
        line taken. An interactive one counts every running sequence (batch ones hold their slots too) but no
        waiting batch one. A finalizing sequence holds its place for the one step it has left."""
        if priority == "batch":
            return self.batch_running() + len(self.queues["batch"]) >= self.batch_slots + self.queue_depth
        return len(self.running) + len(self.queues["interactive"]) >= self.max_concurrent + self.queue_depth

    def add(self, seq: Sequence) -> None:
        """Queues a sequence in its priority's line, armed with this model's repetition detector; the caller checked
        `is_full(seq.priority)` and that the prompt fits the window."""
        seq.arrival = self.clock()
        if self.repetition_span:
            seq.repetition = RepetitionDetector(self.repetition_span)
        self.queues[seq.priority].append(seq)

    def abort(self, request_id: str) -> Sequence | None:
        """Removes a sequence wherever it is and frees its KV slot now; None when it is not here."""
        for seq in self.running:
            if seq.request_id == request_id:
                self.running.remove(seq)
                self._release(seq)
                return seq
        for queue in self.queues.values():
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    self._release(seq)
                    return seq
        return None

    def abort_all(self) -> list[Sequence]:
        """Aborts every sequence; returns those a client still waits on (not the finalizing ones)."""
        seqs = [*self.running, *self.waiting]
        for seq in seqs:
            self.abort(seq.request_id)
        return [s for s in seqs if not s.finalizing]

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def schedule(self) -> StepPlan:
        """What the next step runs: admit waiting sequences to free decode slots (unless paused; `_next_waiting`
        says which), then the next chunks of the running sequences still prefilling, interactive ones first and
        oldest first, `prefill_chunk` tokens in all (several short prompts share a step, so a burst of arrivals gets
        its first tokens sooner while decoders still wait at most one chunk), and every running sequence that has a
        token to feed."""
        admitted = []
        while not self.paused and len(self.running) < self.max_concurrent and (seq := self._next_waiting()):
            self._attach_kv(seq)
            self.running.append(seq)
            admitted.append(seq)
            if self.metrics is not None:
                self.metrics.took_slot(seq, self.clock())
        prefills, budget = [], self.prefill_chunk
        for seq in sorted(self.running, key=_is_batch):  # stable: oldest first within a priority
            if budget == 0:
                break
            if not seq.prefill_done and not seq.finalizing:
                chunk = seq.next_chunk(budget)
                prefills.append((seq, chunk))
                budget -= len(chunk)
        return StepPlan(admitted, prefills, [s for s in self.running if s.output_ids])

    def _next_waiting(self) -> Sequence | None:
        """Takes the sequence the next free slot goes to: the oldest interactive one, else the oldest batch one while
        fewer than `batch_slots` batch sequences run; None when neither may have it."""
        if self.queues["interactive"]:
            return self.queues["interactive"].popleft()
        if self.queues["batch"] and self.batch_running() < self.batch_slots:
            return self.queues["batch"].popleft()
        return None

    def _attach_kv(self, seq: Sequence) -> None:
        """Gives an admitted sequence its slot, holding whatever KV of its prompt is already computed."""
        if seq.session is not None and self.sessions is not None:
            turn = self.sessions.begin_turn(seq.session, seq.prompt_ids)
            seq.slot, seq.conversation, seq.session_conflict = turn.slot, turn.conversation, turn.conflict
            seq.cached_tokens = turn.cached_tokens
        else:
            seq.slot = self.runner.allocate_slot()
            # a scored prompt is computed whole: reused blocks would have no logits to score their tokens with
            scored = seq.prompt_logprobs is not None
            seq.cached_tokens = 0 if scored else self.runner.reuse_prefix(seq.slot, seq.prompt_ids)
        seq.num_prefilled = seq.cached_tokens

    def step(self) -> list[StepResult]:
        """Runs one engine step; returns what it produced, in order, for the worker to send."""
        plan = self.schedule()
        out: list[StepResult] = [
            Admitted(
                request_id=s.request_id,
                prompt_tokens=len(s.prompt_ids),
                cached_tokens=s.cached_tokens,
                kv_cap=self.context_window,
                thinking=s.think is not None and s.think.state == "open",
            )
            for s in plan.admitted
        ]
        rows: list[Sequence] = []
        logits: list[torch.Tensor] = []
        if plan.prefills or plan.decode:
            self.forward_steps += 1
            started = time.perf_counter()
            scored = frozenset(i for i, (seq, _) in enumerate(plan.prefills) if seq.prompt_logprobs is not None)
            chunk_logits, decoded = self.runner.step(
                [(seq.slot, chunk) for seq, chunk in plan.prefills],
                [s.slot for s in plan.decode],
                [s.last_token for s in plan.decode],
                all_logits=scored,
            )
            if plan.prefills:
                tokens = sum(len(chunk) for _, chunk in plan.prefills) + len(plan.decode)
                self._measure_prefill(tokens, time.perf_counter() - started)
            for (seq, chunk), chunk_out in zip(plan.prefills, chunk_logits, strict=True):
                last = self._score_chunk(seq, chunk_out) if seq.prompt_logprobs is not None else chunk_out
                seq.num_prefilled += len(chunk)
                if seq.prefill_done and seq.prompt_logprobs is not None:
                    out.append(Streamed(seq.request_id, [], "", prompt_logprobs=self._scored_prompt(seq)))
                if seq.prefill_done and seq.options.max_tokens == 0:  # only the prompt was asked for (its logprobs)
                    out.append(self._end_unsampled(seq))
                elif seq.prefill_done:
                    rows.append(seq)
                    logits.append(last[None])
        if plan.decode:
            sampled_rows = [i for i, s in enumerate(plan.decode) if not s.finalizing]
            rows += [plan.decode[i] for i in sampled_rows]
            logits.append(decoded if len(sampled_rows) == len(plan.decode) else decoded[sampled_rows])
            self._end_finalizing([s for s in plan.decode if s.finalizing])
        if rows:
            for seq in rows:
                seq.sampling.forced_token = None if seq.think is None else seq.think.forced_token
            sampled = sample_batch(torch.cat(logits), [s.sampling for s in rows])  # logits: [B, V]
            out += self.postprocess(rows, sampled)
        return out

    def settle(self) -> None:
        """Runs now the decode that keeps the last token's KV of every finished session turn (the next step would),
        so that a session call answered between steps sees those turns ended."""
        if finalizing := [s for s in self.running if s.finalizing]:
            self.forward_steps += 1
            self.runner.decode([s.slot for s in finalizing], [s.last_token for s in finalizing])
            self._end_finalizing(finalizing)

    def _end_finalizing(self, finalizing: list[Sequence]) -> None:
        """Their last token's KV is written: they leave the batch and their conversations keep the KV."""
        for seq in finalizing:
            self.running.remove(seq)
            self._release(seq)

    def _score_chunk(self, seq: Sequence, chunk_logits: torch.Tensor) -> torch.Tensor:
        """Records the log-probability of each prompt token that the chunk's positions predict (teacher forcing:
        position i's logits score token i + 1), from the chunk's logits of every position [L, V]. Returns the last
        position's logits [V]."""
        start = seq.num_prefilled
        logprobs = chunk_logits.log_softmax(-1)  # [L, V]
        targets = seq.prompt_ids[start + 1 : start + 1 + len(chunk_logits)]  # the last target may be past the chunk
        rows = torch.arange(len(targets))
        chosen = logprobs[rows, torch.tensor(targets, dtype=torch.long)].tolist()
        top = logprobs[: len(targets)].topk(seq.prompt_logprobs, dim=-1) if seq.prompt_logprobs else None
        token_bytes = self.tokenizer.token_bytes
        for j, (token_id, value) in enumerate(zip(targets, chosen, strict=True)):
            alternatives = []
            if top is not None:
                pairs = zip(top.indices[j].tolist(), top.values[j].tolist(), strict=True)
                alternatives = [TopLogprob(token_id=t, token=token_bytes(t), logprob=v) for t, v in pairs]
            entry = TokenLogprob(token_id=token_id, token=token_bytes(token_id), logprob=value, top=alternatives)
            seq.prompt_entries.append(entry)
        return chunk_logits[-1]

    def _end_unsampled(self, seq: Sequence) -> Ended:
        """A sequence that asked for no output tokens ends once its prompt is in."""
        seq.finish_reason = "length"
        self.running.remove(seq)
        self._release(seq)
        return self._finished(seq)

    def _measure_prefill(self, tokens: int, seconds: float) -> None:
        if seconds > 0:
            rate = tokens / seconds
            self.prefill_tok_per_s = rate if not self.prefill_tok_per_s else 0.8 * self.prefill_tok_per_s + 0.2 * rate

    def expire_waiting(self) -> list[Expired]:
        """Refuses (queue_timeout) the interactive sequences that waited longer than `queue_timeout` (batch ones wait
        their turn: see the module docstring); runs even while paused, so the worker calls it on its own schedule
        rather than in `step()`."""
        now = self.clock()
        queue = self.queues["interactive"]
        expired = [s for s in queue if now - s.arrival > self.queue_timeout]
        for seq in expired:
            queue.remove(seq)
            self._release(seq)
        message = f"no decode slot became free within {self.queue_timeout:g} s"
        return [Expired(s.request_id, message) for s in expired]

    def postprocess(self, rows: list[Sequence], sampled: SampledTokens) -> list[StepResult]:
        """Appends each row's sampled token; finished sequences leave the batch and free their slot now."""
        out: list[StepResult] = []
        now = self.clock()
        for seq, token_id, logprobs in zip(rows, sampled.token_ids, sampled.logprobs, strict=True):
            text = seq.append_token(token_id)
            if self.metrics is not None:
                self.metrics.token(seq, now)
            if seq.think is not None:
                seq.think.observe(text)
                if seq.deferred_grammar is not None and seq.think.state == "closed":
                    seq.arm_deferred_grammar()
                elif seq.think.state == "open" and seq.sampling.grammar is not None:  # the output opened the block
                    seq.defer_grammar()
            lps = None
            if logprobs is not None:  # a stop token ends the turn and is not part of the text: it has no entry
                entry = (
                    None if token_id in seq.stop_token_ids else self._token_logprob(token_id, seq.token_text, logprobs)
                )
                lps = seq.spell(entry, text)
            out.append(Streamed(seq.request_id, [token_id], text, logprobs=lps))
            if seq.is_finished:
                if seq.conversation is not None and seq.slot is not None:
                    seq.finalizing = True
                else:
                    self.running.remove(seq)
                    self._release(seq)
                out.append(self._finished(seq))
        return out

    def _finished(self, seq: Sequence) -> Ended:
        if self.metrics is not None:
            self.metrics.ended(len(seq.prompt_ids), seq.cached_tokens, len(seq.output_ids))
        return Ended(
            request_id=seq.request_id,
            finish_reason=seq.finish_reason,
            prompt_tokens=len(seq.prompt_ids),
            completion_tokens=len(seq.output_ids),
            cached_tokens=seq.cached_tokens,
            kv_used=seq.num_tokens,
            kv_cap=self.context_window,
            session_conflict=seq.session_conflict,
            grammar_complete=None if (grammar := seq.grammar) is None else grammar.is_accepting(),
        )

    def _scored_prompt(self, seq: Sequence) -> list[TokenLogprob]:
        """Every prompt token's entry, with the text it adds to the decoded prompt (so the entries spell it); the
        first token has no log-probability (nothing before it to score it by)."""
        detokenizer = IncrementalDetokenizer(self.tokenizer)
        texts = [detokenizer.push(token_id) for token_id in seq.prompt_ids]
        texts[-1] += detokenizer.flush()
        first = seq.prompt_ids[0]
        entries = [TokenLogprob(token_id=first, token=self.tokenizer.token_bytes(first), logprob=None)]
        entries += seq.prompt_entries
        for entry, text in zip(entries, texts, strict=True):
            entry.text = text
        return entries

    def _release(self, seq: Sequence) -> None:
        """Frees a sequence's slot, or hands it to its session's conversation. Ends a session turn exactly once."""
        if seq.session is not None and self.sessions is not None:
            self.sessions.end_turn(seq.session, seq.conversation, seq.slot)
            seq.session = None
        elif seq.slot is not None:
            self.runner.free_slot(seq.slot)
        seq.slot = None

    def _token_logprob(self, token_id: int, text: str, lp: TokenLogprobs) -> TokenLogprob:
        token_bytes = self.tokenizer.token_bytes
        top = [TopLogprob(token_id=tid, token=token_bytes(tid), logprob=value) for tid, value in lp.top]
        return TokenLogprob(token_id=token_id, token=token_bytes(token_id), text=text, logprob=lp.logprob, top=top)


def _is_batch(seq: Sequence) -> bool:
    return seq.priority == "batch"
