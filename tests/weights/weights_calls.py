"""Helpers for the /api/weights tests: a trainer's raw calls (status, envelope), and a model loaded attachable."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from pantheon_site.tokens import do_create_token
from tests.inference.serving import PantheonServer, bearer
from tests.inference.session_turns import load

EOS = 2  # stories260K's end of sequence: banned with logit_bias where a test needs long decodes
PROMPT = [{"role": "user", "content": "Once upon a time"}]


@dataclass
class Answer:
    status: int
    body: dict
    headers: httpx.Headers

    @property
    def data(self) -> dict:
        assert self.status == 200 and self.body["success"] is True and self.body["error"] is None, self.body
        return self.body["data"]

    @property
    def error(self) -> tuple[int, str, str | None]:
        """(status, code, reason) of a refusal, after checking the management envelope."""
        assert self.body["success"] is False and self.body["data"] is None, self.body
        return self.status, self.body["error"]["code"], self.body["error"]["reason"]


def weights_call(
    server: PantheonServer,
    route: str,
    token: str | None = None,
    attachment: str | None = None,
    body: dict | None = None,
    method: str = "POST",
) -> Answer:
    headers = bearer(token) if token else {}
    if attachment is not None:
        headers["X-miLLM-Attachment"] = attachment
    response = httpx.request(method, f"{server.url}/api/weights/{route}", headers=headers, json=body, timeout=120)
    return Answer(response.status_code, response.json(), response.headers)


def status(server: PantheonServer) -> dict:
    return weights_call(server, "status", method="GET").data


class Holder:
    """A trainer's side of one attachment, by raw HTTP: `attach()`, then `call(route)` with the attachment header."""

    def __init__(self, server: PantheonServer, token: str):
        self.server, self.token = server, token
        self.attachment_id: str | None = None

    def attach(self, **body) -> dict:
        data = weights_call(self.server, "attach", self.token, body=body).data
        self.attachment_id = data["attachment_id"]
        return data

    def call(self, route: str, body: dict | None = None) -> Answer:
        return weights_call(self.server, route, self.token, self.attachment_id, body)

    def ok(self, route: str, body: dict | None = None) -> dict:
        """The data of a call that must succeed."""
        return self.call(route, body).data

    def detach(self) -> None:
        """Detaches if still attached (a test's cleanup: the next test must be able to unload)."""
        if self.attachment_id is not None:
            self.call("detach")
            self.attachment_id = None


def new_token(role: str, label: str) -> str:
    return do_create_token(role, label)[1]


def load_attachable(api: httpx.Client, path, name: str = "stories", label: str = "trainer") -> str:
    """Creates a trainer token (so the load is attachable) and loads the model; returns the token's secret."""
    secret = new_token("trainer", label)
    load(api, path, name)
    return secret


def greedy(url: str) -> httpx.Response:
    """A greedy chat completion from "stories" (its X-miLLM-Model says which weights answered)."""
    body = {"model": "stories", "messages": PROMPT, "temperature": 0, "max_tokens": 24}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response


def text(response: httpx.Response) -> str:
    return response.json()["choices"][0]["message"]["content"]
