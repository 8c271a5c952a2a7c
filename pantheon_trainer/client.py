"""The trainer's side of /api/weights: attach to the weights Pantheon serves, write them in place between quiesce and
resume, save checkpoints, detach. Imports torch, httpx and the engine's handle code; never Django.

    with WeightsClient("http://127.0.0.1:8000", token, model="stories") as client:  # attaches; heartbeats
        weights = client.tensors                      # name -> tensor, views of the served storage
        with client.write():                          # quiesce, commit-begin ... commit-end, resume
            weights["model.norm.weight"].mul_(0.5)
        client.save(run_id="run-1")                   # checkpoints/run-1/step-1/
                                                      # detach (releasing the handles) on exit

`model` names the served model every call is for (the body field `model`; `status()` and `lineage()` send it as the
query parameter); without it the server picks its default, which exists only while one attachable model is served
(docs/weights.md, "Which model a call is for").

Each storage is rebuilt exactly once and every parameter is a view of it (inference/engine/weights/handles.py), so
dropping `tensors` and detaching releases everything the attachment mapped. docs/weights.md has the whole story.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import torch

from inference.engine.weights.handles import rebuild_parameters

ATTACHMENT_HEADER = "X-miLLM-Attachment"


class WeightsCallFailed(Exception):
    """A refused or failed call: the HTTP status, the spec's code and reason, and the message."""

    def __init__(self, status: int, error: dict[str, Any]):
        self.status = status
        self.code = error.get("code", "")
        self.reason = error.get("reason")
        self.details = error.get("details") or {}
        super().__init__(f"{status} {self.code}: {error.get('message', '')}")


class WeightsClient:
    """One attachment to `model` (its served name; "" for the server's default). `attach()` (or entering the
    context) attaches and starts the heartbeat thread at the interval the server suggests; `detach()` (or leaving
    it) drops the tensors, stops the heartbeats and detaches."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 120.0, model: str = ""):
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout, headers={"Authorization": f"Bearer {token}"}
        )
        self.model = model
        self.attachment_id: str | None = None
        self.attached: dict[str, Any] = {}  # the attach response, without the id
        self.tensors: dict[str, torch.Tensor] = {}
        self._stop = threading.Event()
        self._heartbeats: threading.Thread | None = None
        self.heartbeat_failures = 0

    # -- the calls ------------------------------------------------------------------------------------------------

    def call(self, route: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST /api/weights/<route> for `model` (as the holder once attached); the response's `data`, or
        WeightsCallFailed."""
        headers = {ATTACHMENT_HEADER: self.attachment_id} if self.attachment_id else {}
        body = {"model": self.model, **(body or {})} if self.model else body or {}
        return self._data(self._http.post(f"/api/weights/{route}", json=body, headers=headers))

    def _get(self, route: str) -> dict[str, Any]:
        return self._data(self._http.get(f"/api/weights/{route}", params={"model": self.model} if self.model else {}))

    @staticmethod
    def _data(response: httpx.Response) -> dict[str, Any]:
        payload = response.json()
        if not payload.get("success"):
            raise WeightsCallFailed(response.status_code, payload.get("error") or {})
        return payload["data"]

    def status(self) -> dict[str, Any]:
        """GET status of `model` (without one: the default's, and every served model's in `models`)."""
        return self._get("status")

    def lineage(self) -> list[dict[str, Any]]:
        """The parent chain of `model`'s served weights: served, each checkpoint, the base model."""
        return self._get("lineage")["chain"]

    def load(self, checkpoint: str | int) -> dict[str, Any]:
        """Writes a checkpoint (qualified name, id or directory) into `model`'s served weights in place."""
        return self.call("load", {"checkpoint": checkpoint})

    def attach(self) -> dict[str, torch.Tensor]:
        """Attaches and maps the served parameters; returns them by Hugging Face name."""
        data = self.call("attach")
        self.attachment_id = data.pop("attachment_id")
        self.attached = data
        self.tensors = rebuild_parameters(data)
        interval = data["heartbeat"]["interval_hint_s"]
        self._stop.clear()
        self._heartbeats = threading.Thread(target=self._beat, args=(interval,), name="weights-heartbeat", daemon=True)
        self._heartbeats.start()
        return self.tensors

    def _beat(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.call("heartbeat")
            except (httpx.HTTPError, WeightsCallFailed):  # counted; the server marks us stale if it lasts
                self.heartbeat_failures += 1

    @contextlib.contextmanager
    def write(self) -> Iterator[dict[str, torch.Tensor]]:
        """Brackets one in-place write: quiesce, commit-begin, yield the tensors (write under no_grad), synchronise
        the device, commit-end, resume. Serving resumes however the block ends; a block that raises still ends the
        commit, so the set is left clean with whatever was written."""
        self.call("quiesce")
        try:
            self.call("commit-begin")
            try:
                with torch.no_grad():
                    yield self.tensors
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            finally:
                self.last_commit = self.call("commit-end")
        finally:
            self.call("resume")

    def save(self, run_id: str, step: int | None = None) -> dict[str, Any]:
        """Saves the served weights as checkpoints/<run_id>/step-<step>/ (default step: the lineage's next, the
        loaded or last saved checkpoint's step plus the commits since)."""
        body: dict[str, Any] = {"run_id": run_id}
        if step is not None:
            body["step"] = step
        return self.call("save", body)

    def detach(self) -> dict[str, Any] | None:
        """Drops every rebuilt tensor (releasing the handles), stops the heartbeats and detaches."""
        if self.attachment_id is None:
            return None
        self.tensors.clear()
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()
        self._stop.set()
        if self._heartbeats is not None:
            self._heartbeats.join()
        try:
            return self.call("detach")
        finally:
            self.attachment_id = None

    def close(self) -> None:
        self.detach()
        self._http.close()

    def __enter__(self) -> WeightsClient:
        self.attach()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
