"""The worker's log lines about its generations and embedding calls, each carrying the HTTP request id its SUBMIT
or EMBED brought.

A worker's loop serves every request at once, so the request id cannot come from the logging context as it does in the
control plane (contract/logs.py): each line passes it (`extra`). One line when a sequence ends (finished, refused or
failed: the last message the worker sends for it; or aborted by the control plane) at INFO, and one at DEBUG when it is
submitted; likewise an embedding call, which ends with its EMBEDDINGS or ERROR. The lines hold counts, reasons and
times, never the prompt or the output.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from inference.engine.contract import messages as p

log = logging.getLogger("pantheon.worker.sequences")


@dataclass(slots=True)
class _Open:
    http_request_id: str | None
    model: str
    submitted: float


class SequenceLog:
    """Follows each SUBMIT from its arrival to the message that ends it, and logs both ends."""

    def __init__(self) -> None:
        self._open: dict[str, _Open] = {}  # generation id -> what its lines need

    def submitted(self, submit: p.Submit | p.Embed) -> None:
        self._open[submit.request_id] = _Open(submit.http_request_id, submit.model, time.monotonic())
        log.debug("sequence %s submitted to %s", submit.request_id, submit.model, extra=self._extra(submit.request_id))

    def sent(self, message: p.Message) -> None:
        """Notes a message the worker sends: a FINISHED or ERROR ends its sequence."""
        for inner in message.messages if isinstance(message, p.StepOutputs) else (message,):
            if isinstance(inner, p.Finished | p.Error | p.Embeddings) and inner.request_id in self._open:
                self._ended(inner)

    def aborted(self, request_id: str) -> None:
        if request_id in self._open:
            extra = self._extra(request_id)
            sequence = self._open.pop(request_id)
            log.info("sequence %s of %s aborted after %.1f ms", request_id, sequence.model, _ms(sequence), extra=extra)

    def _ended(self, message: p.Finished | p.Error | p.Embeddings) -> None:
        extra = self._extra(message.request_id)
        sequence = self._open.pop(message.request_id)
        if isinstance(message, p.Embeddings):
            inputs, tokens = len(message.prompt_tokens), sum(message.prompt_tokens)
            log.info(
                "embedding call %s of %s answered: %d inputs, %d tokens, %.1f ms",
                message.request_id,
                sequence.model,
                inputs,
                tokens,
                _ms(sequence),
                extra=extra,
            )
        elif isinstance(message, p.Finished):
            log.info(
                "sequence %s of %s finished (%s): prompt %d tokens (%d cached), completion %d tokens, %.1f ms",
                message.request_id,
                sequence.model,
                message.finish_reason,
                message.prompt_tokens,
                message.cached_tokens,
                message.completion_tokens,
                _ms(sequence),
                extra=extra,
            )
        else:
            reason = message.reason.value
            log.info("sequence %s of %s ended: %s", message.request_id, sequence.model, reason, extra=extra)

    def _extra(self, request_id: str) -> dict:
        sequence = self._open[request_id]
        return {"request_id": sequence.http_request_id, "sequence": request_id, "model": sequence.model}


def _ms(sequence: _Open) -> float:
    return (time.monotonic() - sequence.submitted) * 1000
