"""Stored responses of /v1/responses, kept in the control plane's memory so that `previous_response_id` can continue
a conversation and GET / DELETE can find one, with no database query on /v1.

A stored response keeps its conversation (the chat messages it was generated from, and its output as the assistant
turn) and its response body. The store holds the PANTHEON_RESPONSES_STORED most recently stored or used; older ones
are forgotten (a continuation of one is then 404, as of a deleted one). A restart forgets them all.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from django.conf import settings


@dataclass(slots=True)
class StoredResponse:
    id: str
    model: str
    messages: list[dict[str, Any]]  # the conversation up to and including this response's output
    body: dict[str, Any]  # the response object, as it was returned


class ResponseStore:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response: StoredResponse) -> None:
        self._responses[response.id] = response
        self._responses.move_to_end(response.id)
        while len(self._responses) > self.capacity:
            self._responses.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        found = self._responses.get(response_id)
        if found is not None:
            self._responses.move_to_end(response_id)
        return found

    def delete(self, response_id: str) -> bool:
        return self._responses.pop(response_id, None) is not None


_store: ResponseStore | None = None


def response_store() -> ResponseStore:
    """The process's store, made on first use with PANTHEON_RESPONSES_STORED places."""
    global _store
    if _store is None:
        _store = ResponseStore(settings.PANTHEON_RESPONSES_STORED)
    return _store
