"""A worker process: `python -m inference.engine.worker_process --endpoint ENDPOINT --device cpu|cuda:N --identity ID`
(the supervisor starts it, with the control plane's log format and level). Connects the DEALER socket, picks the
torch thread count, wires SIGTERM to a clean stop and runs the Worker loop (worker.py) until SHUTDOWN.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal

import torch
import zmq

from inference.engine import kernels
from inference.engine.contract.io_threads import batch_io_threads
from inference.engine.contract.logs import LOG_FORMATS, configure_worker_logging
from inference.engine.worker import HEARTBEAT_INTERVAL, Worker


def compute_threads() -> int:
    """Intra-op threads for a large model's steps: OMP_NUM_THREADS when set, else every CPU this process may use.

    torch's parallel regions wait for all their threads at every op, so on a host where other processes keep the
    cores busy one preempted thread stalls every op, and two threads become several times slower than one. Set
    OMP_NUM_THREADS=1 (or leave a core free) on such a host; on a quiet one, two threads serve a large model faster
    (docs/performance-log.md).
    """
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, len(os.sched_getaffinity(0)))


def serve(endpoint: str, device: str, identity: str, *, context: zmq.Context | None = None,
          parent_pid: int | None = None, heartbeat_interval: float = HEARTBEAT_INTERVAL,
          threads: int | None = None, freeze_heap: bool = False) -> None:  # fmt: skip
    """Connects to the control plane and runs the worker loop until SHUTDOWN (or SIGTERM, in a process);
    `freeze_heap` when the worker owns its process (Worker says why)."""
    context = context or batch_io_threads(zmq.Context.instance())
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.IDENTITY, identity.encode())
    socket.setsockopt(zmq.SNDHWM, 0)  # never block the loop on a slow control plane: queue instead
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.setsockopt(zmq.LINGER, 1000)
    socket.connect(endpoint)
    worker = Worker(
        socket,
        device,
        parent_pid=parent_pid,
        heartbeat_interval=heartbeat_interval,
        threads=threads,
        freeze_heap=freeze_heap,
    )
    if parent_pid is not None:
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the control plane's to handle
    try:
        worker.run()
    finally:
        socket.close()


def log_start(device: str) -> None:
    """One line on stderr (which `serve` shares) saying which C kernels this worker runs, or that torch runs all."""
    logging.getLogger("pantheon.worker").info("worker %s: %s", device, kernels.describe())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A Pantheon worker process (started by the supervisor).")
    parser.add_argument("--endpoint", required=True, help="the control plane's ZMQ ROUTER endpoint")
    parser.add_argument("--device", required=True, help="cpu or cuda:N")
    parser.add_argument("--identity", required=True, help="this worker's ZMQ identity")
    parser.add_argument("--heartbeat-interval", type=float, default=HEARTBEAT_INTERVAL, help="seconds")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="plain", help="as PANTHEON_LOG_FORMAT")
    parser.add_argument("--log-level", default="INFO", help="as PANTHEON_LOG_LEVEL")
    args = parser.parse_args(argv)
    configure_worker_logging(args.log_format, args.log_level)
    log_start(args.device)
    if args.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(args.device))
    serve(args.endpoint, args.device, args.identity, parent_pid=os.getppid(),
          heartbeat_interval=args.heartbeat_interval, threads=compute_threads(), freeze_heap=True)  # fmt: skip


if __name__ == "__main__":
    main()
