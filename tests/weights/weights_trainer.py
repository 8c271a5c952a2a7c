"""A trainer process, as a user would write one with pantheon_trainer/client.py: attach, one in-place write inside the
barrier, save, detach. Run by test_weights_trainer.py: `python -m tests.weights.weights_trainer URL TOKEN RUN_ID`.

It reports each step as a JSON line on stdout, and waits for a line on stdin inside the write (so the test can send
requests while serving is held) and before the save.
"""

from __future__ import annotations

import json
import sys

from pantheon_trainer.client import WeightsClient


def report(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main() -> None:
    url, token, run_id = sys.argv[1:4]
    with WeightsClient(url, token) as client:
        report("attached", parameters=len(client.tensors), storages=len(client.attached["storages"]))
        with client.write() as tensors:
            report("writing")
            sys.stdin.readline()
            tensors["model.norm.weight"].mul_(-1.0)  # negated logits: the greedy choice becomes the least likely
        report("committed", **client.last_commit)
        sys.stdin.readline()  # the test reads the trained output first
        report("saved", **client.save(run_id))
    report("detached")


if __name__ == "__main__":
    main()
