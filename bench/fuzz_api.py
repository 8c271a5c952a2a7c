"""The full fuzzing run: schemathesis against every route of the OpenAPI document (GET /api/schema/) of a running
Pantheon, with an operator token, stories260K served; tests/inference/test_fuzz_api.py is its bounded form in CI.
Prints the requests sent by status, the failures (a 5xx other than a documented 503, an answer off the document),
and whether the server still serves at the end. Exits 1 on any failure.

Starts `manage.py serve` on a free loopback port with a temporary data folder and the embedded SQLite database, so it
needs no services. Run: .venv/bin/python bench/fuzz_api.py [--max-examples N] [--seed S] [--model PATH]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.inference.fuzzing import fuzz, still_serving  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} did not answer within {timeout} s")


def run(model_path: str, max_examples: int, seed: int | None) -> bool:
    with tempfile.TemporaryDirectory(prefix="pantheon-fuzz-") as data_dir:
        env = {**os.environ, "PANTHEON_DATA_DIR": data_dir, "PANTHEON_LOG_LEVEL": "ERROR"}
        env.pop("DATABASE_URL", None)
        env.pop("REDIS_URL", None)
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "-v", "0"], cwd=REPO, env=env, check=True)
        created = subprocess.run([*manage, "create_token", "--role", "operator", "--label", "fuzz"], cwd=REPO, env=env,
                                 check=True, capture_output=True, text=True)  # fmt: skip
        token = created.stdout.strip().splitlines()[-1]
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log = Path(data_dir) / "serve.log"
        with log.open("wb") as out:
            server = subprocess.Popen([*manage, "serve", "--port", str(port)], cwd=REPO, env=env, stdout=out,
                                      stderr=subprocess.STDOUT)  # fmt: skip
        try:
            _wait_for(url)
            loaded = httpx.post(f"{url}/admin/models/load", json={"path": model_path, "name": "stories"},
                                headers={"Authorization": f"Bearer {token}"}, timeout=120)  # fmt: skip
            loaded.raise_for_status()
            started = time.monotonic()
            result = fuzz(url, token, max_examples=max_examples, seed=seed)
            elapsed = time.monotonic() - started
            serving = still_serving(url)
            tracebacks = log.read_text(errors="replace").count("Traceback")
        finally:
            server.terminate()
            server.wait(60)
    print(f"max_examples {max_examples} per operation and phase, {elapsed:.0f} s")
    print(result.summary())
    for failure in sorted(set(result.failures)):
        print(f"  {failure}")
    print(f"server still serving: {serving}; tracebacks in its log: {tracebacks}")
    if result.failures or result.exit_code != 0:
        print(result.output[-6000:])
    return serving and not result.failures and result.exit_code == 0


def main() -> None:
    models = Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=str(models / "stories260K-hf"))
    parser.add_argument("--max-examples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    sys.exit(0 if run(args.model, args.max_examples, args.seed) else 1)


if __name__ == "__main__":
    main()
