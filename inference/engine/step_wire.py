"""The worker's side of a step: each plain result a scheduler step returns (step_results.py) as the protocol message
the worker sends for it (contract/messages.py): STARTED, TOKENS, FINISHED, or ERROR queue_timeout."""

from __future__ import annotations

from inference.engine.contract import messages as p
from inference.engine.contract.reasons import Reason
from inference.engine.step_results import Admitted, Ended, Expired, StepResult, Streamed


def wire_message(result: StepResult) -> p.Message:
    """The message that tells the control plane of `result`."""
    if type(result) is Streamed:  # by far the most frequent: one per sequence and step
        return p.Tokens(
            request_id=result.request_id,
            token_ids=result.token_ids,
            text=result.text,
            logprobs=result.logprobs,
            prompt_logprobs=result.prompt_logprobs,
        )
    if type(result) is Admitted:
        return p.Started(
            request_id=result.request_id,
            prompt_tokens=result.prompt_tokens,
            cached_tokens=result.cached_tokens,
            kv_cap=result.kv_cap,
            thinking=result.thinking,
        )
    if type(result) is Ended:
        return p.Finished(
            request_id=result.request_id,
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            cached_tokens=result.cached_tokens,
            kv_used=result.kv_used,
            kv_cap=result.kv_cap,
            session_conflict=result.session_conflict,
            grammar_complete=result.grammar_complete,
        )
    if type(result) is Expired:
        return p.Error(request_id=result.request_id, reason=Reason.QUEUE_TIMEOUT, message=result.message)
    raise TypeError(f"not a step result: {result!r}")


def wire_messages(results: list[StepResult]) -> list[p.Message]:
    return [wire_message(result) for result in results]
