"""Running one batch to its end: what the Celery task `batches.run_batch` does (docs/batches.md).

1) take the batch's lease (batches/lease.py), or do nothing: another task runs it, or it is gone or ended;
2) validating -> in_progress;
3) send the pending lines in line order, several in flight, each counted before it is sent and recorded once when
   answered (batches/line_records.py); a "wait" answer records nothing: the batch shows why it waits and tries
   again after Retry-After; at every line boundary the lease is renewed when due and the status re-read: cancelling
   starts no new line, a passed expiry starts none either and reports the lines not run as batch_expired;
4) finalize: write the output and error files (batches/batch_files.py) and set the terminal status.

Each step is a conditional update on what the previous one left, so a task killed anywhere and run again continues
at the first unrecorded line: lines recorded before are not sent again, and the files are not written twice.

The lines go out on an asyncio loop (httpx); the database is reached through one thread (sync_to_async), so the
loop never blocks on it.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from enum import Enum

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections, transaction
from django.utils import timezone

from batches.batch_files import input_path, write_result_files
from batches.lease import new_lease_owner, release_lease, renew_lease, take_lease
from batches.line_records import count_attempt, error_line, record_line
from batches.line_sender import LineResult, Wait, line_body, send_line
from batches.models import Batch, BatchLine, BatchStatus, LineState
from batches.server_target import ServerTarget, find_server

logger = logging.getLogger("pantheon.batches")
db = functools.partial(sync_to_async, thread_sensitive=True)  # one thread: one connection, never the loop's

EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
TERMINAL_FIELD = {BatchStatus.COMPLETED: "completed_at", BatchStatus.EXPIRED: "expired_at",
                  BatchStatus.CANCELLED: "cancelled_at"}  # fmt: skip


class Stop(Enum):
    """Why the lines stopped: all recorded, cancelling, expired, or the lease was lost (another task runs it)."""

    DONE = "done"
    CANCELLING = "cancelling"
    EXPIRED = "expired"
    LOST = "lost"


@dataclass(order=True, frozen=True, slots=True)
class PendingLine:
    number: int
    id: int = field(compare=False)
    custom_id: str = field(compare=False)
    offset: int = field(compare=False)
    length: int = field(compare=False)


def run_batch(batch_id: str) -> None:
    """Runs the batch to its end, or until its lease is lost; a no-op for a batch that is gone, ended or held."""
    owner = new_lease_owner()
    if not take_lease(batch_id, owner):
        return
    try:
        asyncio.run(BatchRun(batch_id, owner).run())
    finally:
        release_lease(batch_id, owner)


class BatchRun:
    """One task's run of one batch, holding its lease."""

    def __init__(self, batch_id: str, owner: str):
        self.batch_id, self.owner = batch_id, owner
        self.server: ServerTarget | None = None
        self.waiting_reason = ""  # as last written on the batch
        self.resume_at = 0.0  # monotonic time before which no line starts (a wait answer's Retry-After)
        self.waits_in_a_row = 0
        self.renew_at = time.monotonic() + settings.PANTHEON_BATCH_LEASE_S / 3

    async def run(self) -> None:
        await db(close_old_connections)()
        try:
            await self._run()
        finally:
            await db(connections.close_all)()

    async def _run(self) -> None:
        batch = await db(_begin)(self.batch_id, self.owner)
        if batch is None:
            return
        if batch.status == BatchStatus.IN_PROGRESS:
            stop = await self.run_lines(batch)
            logger.info("batch %s: lines stopped (%s)", self.batch_id, stop.value)
            if stop is Stop.LOST:
                return
            if stop is Stop.EXPIRED:
                await db(_expire_rest)(self.batch_id, self.owner)
            elif stop is Stop.DONE:
                await db(_to_finalizing)(self.batch_id, self.owner)
        await db(_finalize)(self.batch_id, self.owner)

    # -- the lines ------------------------------------------------------------------------------------------------

    async def run_lines(self, batch: Batch) -> Stop:
        """Sends the pending lines until all are recorded or the batch must stop; returns why it stopped."""
        queue = await db(_pending_lines)(self.batch_id)  # sorted by number: already a heap
        in_flight: dict[asyncio.Task, PendingLine] = {}
        stop: Stop | None = None
        tick = min(1.0, settings.PANTHEON_BATCH_LEASE_S / 3)
        timeout = httpx.Timeout(settings.PANTHEON_BATCH_LINE_TIMEOUT_S, connect=5.0)
        fd = _open_input(batch)
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                while True:
                    # 1) a line boundary: keep the lease, and see whether the batch was cancelled or expired
                    if time.monotonic() >= self.renew_at:
                        if not await db(renew_lease)(self.batch_id, self.owner):
                            for task in in_flight:
                                task.cancel()
                            return Stop.LOST
                        self.renew_at = time.monotonic() + settings.PANTHEON_BATCH_LEASE_S / 3
                    if stop is None:
                        stop = await db(_must_stop)(self.batch_id)
                    # 2) start lines up to the in-flight limit, unless stopping or waiting
                    if stop is None and time.monotonic() >= self.resume_at:
                        while queue and len(in_flight) < settings.PANTHEON_BATCH_LINES_IN_FLIGHT:
                            line = heapq.heappop(queue)
                            in_flight[asyncio.create_task(self.run_line(client, batch, fd, line))] = line
                    if not in_flight:
                        if stop is not None or not queue:
                            return stop or Stop.DONE
                        await asyncio.sleep(max(0.0, min(self.resume_at - time.monotonic(), tick)))
                        continue
                    # 3) record what answered
                    done, _ = await asyncio.wait(in_flight, timeout=tick, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        await self.settle(in_flight.pop(task), task.result(), queue)
        finally:
            if fd is not None:
                os.close(fd)

    async def run_line(self, client: httpx.AsyncClient, batch: Batch, fd: int | None, line: PendingLine):
        """Sends one line; what to record (LineResult), a Wait, or None when it was recorded already."""
        raw = os.pread(fd, line.length, line.offset) if fd is not None else b""
        body = line_body(line.custom_id, raw)
        if isinstance(body, LineResult):
            return body
        server = self.server or await asyncio.to_thread(find_server)  # a local: other lines may forget it meanwhile
        if server is None:
            return Wait("server_unavailable", None, find_server_again=True)
        self.server = server
        if not await db(count_attempt)(line.id):
            return None
        request_id = f"{batch.id.replace('_', '-')}.{line.number}.{uuid.uuid4().hex[:8]}"
        return await send_line(client, server, batch.endpoint, line.custom_id, body, request_id)

    async def settle(self, line: PendingLine, outcome: LineResult | Wait | None, queue: list) -> None:
        """Records a line's result, or puts it back in the queue and makes the batch wait."""
        if isinstance(outcome, LineResult):
            self.waits_in_a_row = 0
            await db(record_line)(self.batch_id, line.id, outcome.result, outcome.succeeded)
            await self.set_waiting("")
        elif isinstance(outcome, Wait):
            heapq.heappush(queue, line)
            if outcome.find_server_again:
                self.server = None
            await self.set_waiting(outcome.reason)
            if time.monotonic() >= self.resume_at:  # the first wait answer since lines last started: wait longer
                self.waits_in_a_row += 1
                wait_s = self.wait_s(outcome.retry_after)
                self.resume_at = time.monotonic() + wait_s
                logger.info("batch %s waits %.1f s: %s", self.batch_id, wait_s, outcome.reason)

    def wait_s(self, retry_after: float | None) -> float:
        """How long to wait: the server's Retry-After, else doubling from 1 s while waits follow each other (the
        lines in flight together count once); bounded by PANTHEON_BATCH_WAIT_MAX_S."""
        wanted = retry_after if retry_after is not None else 2.0 ** min(self.waits_in_a_row - 1, 16)
        return min(max(wanted, 0.1), settings.PANTHEON_BATCH_WAIT_MAX_S)

    async def set_waiting(self, reason: str) -> None:
        if reason != self.waiting_reason:
            await db(_write_waiting_reason)(self.batch_id, reason)
            self.waiting_reason = reason


def _open_input(batch: Batch) -> int | None:
    """The input file, open for reading lines by offset; None when it is gone (every line then fails)."""
    try:
        return os.open(input_path(batch), os.O_RDONLY)
    except OSError:
        return None


# -- the batch's steps, each a conditional update on what the step before left -----------------------------------


def _begin(batch_id: str, owner: str) -> Batch | None:
    """validating -> in_progress; the batch as it then is (None when it is gone)."""
    Batch.objects.filter(pk=batch_id, lease_owner=owner, status=BatchStatus.VALIDATING).update(
        status=BatchStatus.IN_PROGRESS, in_progress_at=timezone.now()
    )
    return Batch.objects.filter(pk=batch_id).first()


def _pending_lines(batch_id: str) -> list[PendingLine]:
    rows = BatchLine.objects.filter(batch_id=batch_id, state=LineState.PENDING).order_by("number")
    return [PendingLine(number, id_, custom_id, offset, length)
            for id_, number, custom_id, offset, length in rows.values_list("id", "number", "custom_id", "offset",
                                                                            "length")]  # fmt: skip


def _must_stop(batch_id: str) -> Stop | None:
    """Why no new line may start (re-read at every line boundary), or None."""
    batch = Batch.objects.filter(pk=batch_id).only("status", "expires_at").first()
    if batch is None or batch.status == BatchStatus.CANCELLING:
        return Stop.CANCELLING
    if batch.status != BatchStatus.IN_PROGRESS:
        return Stop.LOST
    if timezone.now() >= batch.expires_at:
        return Stop.EXPIRED
    return None


def _write_waiting_reason(batch_id: str, reason: str) -> None:
    Batch.objects.filter(pk=batch_id).update(waiting_reason=reason)


def _expire_rest(batch_id: str, owner: str) -> None:
    """in_progress past its window -> finalizing with expired_at: every line not run is recorded as batch_expired."""
    with transaction.atomic():
        batch = Batch.objects.select_for_update().filter(pk=batch_id, lease_owner=owner).first()
        if batch is None or batch.status != BatchStatus.IN_PROGRESS:
            return
        for line_id, custom_id in BatchLine.objects.filter(batch=batch, state=LineState.PENDING).values_list(
            "id", "custom_id"
        ):
            record_line(batch_id, line_id, error_line(custom_id, "batch_expired", EXPIRED_MESSAGE), False)
        now = timezone.now()
        Batch.objects.filter(pk=batch_id).update(
            status=BatchStatus.FINALIZING, finalizing_at=now, expired_at=now, waiting_reason=""
        )


def _to_finalizing(batch_id: str, owner: str) -> None:
    """in_progress with every line recorded -> finalizing (a batch cancelled meanwhile stays cancelling)."""
    Batch.objects.filter(pk=batch_id, lease_owner=owner, status=BatchStatus.IN_PROGRESS).update(
        status=BatchStatus.FINALIZING, finalizing_at=timezone.now(), waiting_reason=""
    )


def _finalize(batch_id: str, owner: str) -> None:
    """finalizing -> completed (or expired, when the window ended it), cancelling -> cancelled: the output and error
    files first, then the status with them (and the lease let go: an ended batch has no task)."""
    batch = Batch.objects.filter(pk=batch_id, lease_owner=owner).first()
    if batch is None or batch.status not in (BatchStatus.FINALIZING, BatchStatus.CANCELLING):
        return
    if batch.status == BatchStatus.CANCELLING:
        terminal = BatchStatus.CANCELLED
    else:
        terminal = BatchStatus.EXPIRED if batch.expired_at else BatchStatus.COMPLETED
    output_id, error_id = write_result_files(batch)
    ended = {} if terminal == BatchStatus.EXPIRED else {TERMINAL_FIELD[terminal]: timezone.now()}
    Batch.objects.filter(pk=batch_id, lease_owner=owner, status=batch.status).update(
        status=terminal,
        output_file_id=output_id,
        error_file_id=error_id,
        waiting_reason="",
        lease_owner="",
        lease_until=None,
        **ended,
    )
