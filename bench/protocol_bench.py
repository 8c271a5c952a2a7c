"""The worker protocol's cost per engine step: encoding and decoding one STEP_OUTPUTS message that carries one
token for each of N streams (what the worker sends and the control plane reads once per step).

Run: .venv/bin/python bench/protocol_bench.py [--streams 1,8,32] [--number 20000]
"""

from __future__ import annotations

import argparse
import platform
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inference.engine.contract import messages as p  # noqa: E402


def step(streams: int) -> p.StepOutputs:
    tokens = [p.Tokens(request_id=f"{i:032x}", token_ids=[100 + i], text=" word") for i in range(streams)]
    return p.StepOutputs(messages=tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,8,32")
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, python {platform.python_version()}")
    print(f"{'streams':>7}  {'bytes':>6}  {'encode us':>9}  {'decode us':>9}")
    for streams in (int(n) for n in args.streams.split(",")):
        message = step(streams)
        frame = p.encode(message)
        encode = min(timeit.repeat(lambda m=message: p.encode(m), number=args.number, repeat=5)) / args.number
        decode = min(timeit.repeat(lambda f=frame: p.decode_from_worker(f), number=args.number, repeat=5))
        print(f"{streams:>7}  {len(frame):>6}  {encode * 1e6:>9.2f}  {decode / args.number * 1e6:>9.2f}")


if __name__ == "__main__":
    main()
