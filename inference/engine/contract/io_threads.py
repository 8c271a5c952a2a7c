"""The scheduling of libzmq's own I/O threads, at both ends of the worker protocol.

A send hands its message to a background I/O thread of the context and wakes it; a receive is woken by one. Under
Linux's default policy a thread that wakes preempts whatever runs on its core, and on a host whose cores are all busy
(a worker's step, the serving edge, the clients streaming from it) that is the loop that just sent: the worker's
main thread was preempted at nearly every step of a small model, and its send and the next poll took tens of
microseconds each instead of a few (docs/performance.md). Under SCHED_BATCH a woken thread does not preempt: it runs
when a core comes free or the running thread's time slice ends, so the loop goes on with its next step. Messages still
leave within a time slice; a step of a small model is shorter than that, and of a large one, longer.
"""

from __future__ import annotations

import os
from typing import TypeVar

import zmq

ContextT = TypeVar("ContextT", bound=zmq.Context)


def batch_io_threads(context: ContextT) -> ContextT:
    """`context`, with the I/O threads it starts with its first socket under SCHED_BATCH where the OS has that
    policy (Linux); a context whose threads already run keeps theirs."""
    if hasattr(os, "SCHED_BATCH"):
        context.set(zmq.THREAD_SCHED_POLICY, os.SCHED_BATCH)
    return context
