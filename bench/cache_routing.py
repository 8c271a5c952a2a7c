"""Cache-aware against least-busy routing: a multi-turn chat workload without session keys, through a router in front
of two serve instances on loopback (issue 39's workload: 32 conversations of 6 turns sharing 4 system prompts).

For each policy (PANTHEON_ROUTER_POLICY), a fresh router (registry in memory) and two fresh `manage.py serve`
instances (their own data folders; each registers with the router) load the same model, so every run starts with
empty caches; each instance runs its steps on --threads threads (one each: two instances on a two-core host).
--concurrency users run at once, each taking a conversation's turns one after another with a pause between them
(--think-s on average: the user reads and types, so the instances' loads have moved on when the next turn comes):
a streaming /v1/chat/completions request with the whole conversation so far (temperature 0, --max-tokens), whose
answer the user sends back as the assistant's turn, as a chat client does.

The model is a random Llama (bench/random_model.py's 85M shape, hidden 768 x 12 layers, stories260K's tokenizer,
a window of 2048): big enough that prefilling a prompt costs far more than the request's way through the router. Its
weights are random, so to answer in text that tokenizes back to the same ids (as a trained model's answer does, and
as the prefix cache needs to find an answer's KV on the next turn), the bench biases its sampling to whole-word
tokens (`logit_bias`). The texts (system prompts, user turns) are English-like, of the lengths chat traffic has.

Reported per policy: the prefix-cache hit rate (usage cached_tokens over prompt_tokens, all requests), the prompt
tokens prefilled per request, time to first token (the first event with content; mean, p50, p90), the requests each
instance served and why the router chose it (X-Pantheon-Route), the wall time, and per turn the mean TTFT and
prefilled tokens.

Run: .venv/bin/python bench/cache_routing.py [--models DIR] [--policies least_busy,cache_aware] [--concurrency 8]
[--conversations 32] [--turns 6] [--systems 4] [--max-tokens 64] [--think-s 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from random_model import write_random_llama  # noqa: E402
from serve_bench import Server, free_port  # noqa: E402

FLEET_TOKEN = "cache-routing-bench-fleet-token"
WINDOW = 2048
WORDS = (
    "the parcel order customer delivery warehouse route driver invoice refund address label customs form date "
    "window payment account support ticket status update message reply carrier truck depot scan weight size box "
    "please check confirm send return arrive leave track change cancel ship pack sort load wait call write ask "
    "today tomorrow morning evening week early late quickly safely again still already only also never always"
).split()
RULES = (
    "Answer questions about {a} and {b}. Never promise a {c} before you check the {d}. If the {e} is unclear, ask "
    "one short question first. Keep every answer polite, short and specific, and name the {f} you used."
)


@dataclass(slots=True)
class Turn:
    conversation: int
    turn: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    instance: str
    why: str


@dataclass(slots=True)
class RunResult:
    policy: str
    wall_s: float
    turns: list[Turn] = field(default_factory=list)


def sentence(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return text[0].upper() + text[1:] + "."


def system_prompts(count: int, sentences: int) -> list[str]:
    """`count` long system prompts (a role, rules, reference text), each its own."""
    prompts = []
    for i in range(count):
        rng = random.Random(1000 + i)
        rules = RULES.format(**{k: rng.choice(WORDS) for k in "abcdef"})
        body = " ".join(sentence(rng, rng.randint(8, 16)) for _ in range(sentences))
        prompts.append(f"You are assistant number {i} of a shipping company. {rules} Reference notes: {body}")
    return prompts


def user_turns(conversation: int, turns: int) -> list[str]:
    """A user's messages: a sentence or two, far shorter than the answers, as in chat traffic."""
    rng = random.Random(conversation)
    return [" ".join(sentence(rng, rng.randint(5, 10)) for _ in range(rng.randint(1, 2))) for _ in range(turns)]


def think_times(conversation: int, turns: int, mean_s: float) -> list[float]:
    """The pauses before each turn after the first (a user reads the answer and types): uniform around `mean_s`."""
    rng = random.Random(10_000 + conversation)
    return [0.0] + [rng.uniform(0.5 * mean_s, 1.5 * mean_s) for _ in range(turns - 1)]


def whole_word_bias(model_dir: Path) -> dict[str, int]:
    """logit_bias that keeps the random model's answers to whole-word tokens, which tokenize back to themselves."""
    vocab = json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    return {str(i): 100 for token, i in vocab.items() if token.startswith("\u2581") and token[1:].isalpha()}


class Router:
    """`manage.py router` in a child process, stopped (SIGTERM) on exit."""

    def __init__(self, policy: str):
        self.data_dir = Path(tempfile.mkdtemp(prefix="pantheon-bench-router-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PANTHEON_DATA_DIR": str(self.data_dir), "PANTHEON_FLEET_TOKEN": FLEET_TOKEN,
               "PANTHEON_FLEET_REDIS_URL": "", "PANTHEON_ROUTER_POLICY": policy, "PANTHEON_REGISTRY_HEARTBEAT_S": "1",
               "PANTHEON_REGISTRY_TIMEOUT_S": "10"}  # fmt: skip
        self.log = open(self.data_dir / "router.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "router", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_live(self, instances: int, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"router exited: {(self.data_dir / 'router.log').read_text()[-2000:]}")
            try:
                rows = httpx.get(f"{self.url}/v1/models", timeout=5).json()["data"]
                if rows and rows[0].get("live") == instances:
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{instances} instances did not become live at the router")

    stop = Server.stop  # a child process, its log and its data folder, as a serve's


def start_fleet(policy: str, model_dir: Path, slots: int, threads: int) -> tuple[Router, list[Server]]:
    router = Router(policy)
    env = {"PANTHEON_REGISTRY_URL": router.url, "PANTHEON_FLEET_TOKEN": FLEET_TOKEN, "OMP_NUM_THREADS": str(threads),
           "PANTHEON_REGISTRY_HEARTBEAT_S": "1", "PANTHEON_REGISTRY_TIMEOUT_S": "10"}  # fmt: skip
    servers = [Server(env), Server(env)]
    for server in servers:
        headers = {"Authorization": f"Bearer {server.admin_secret}", "X-Pantheon-Actor": "cache_routing_bench"}
        body = {"path": str(model_dir), "name": "m", "max_concurrent": slots, "ctx_cap": WINDOW, "device": "cpu"}
        httpx.post(f"{server.url}/admin/models/load", json=body, headers=headers, timeout=900).raise_for_status()
        # The first request's one-time paths (template, detokenizer, connections), not part of the measurement.
        warm = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
        httpx.post(f"{server.url}/v1/chat/completions", json=warm, timeout=300).raise_for_status()
    router.wait_live(len(servers))
    return router, servers


async def turn_request(client: httpx.AsyncClient, body: dict) -> tuple[float, str, dict, str, str]:
    """One streaming turn: its time to first content, the answer's text, its usage, the instance that served it and
    why the router chose it."""
    started = time.perf_counter()
    ttft, text, usage = None, [], {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        instance = response.headers.get("X-Pantheon-Instance", "?")
        why = response.headers.get("X-Pantheon-Route", "?")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"stream failed: {event['error']}")
            for choice in event.get("choices") or []:
                if content := (choice.get("delta") or {}).get("content"):
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                    text.append(content)
            usage = event.get("usage") or usage
    return (ttft if ttft is not None else time.perf_counter() - started), "".join(text), usage, instance, why


async def conversation(client, index: int, system: str, args, bias: dict, result: RunResult) -> None:
    messages = [{"role": "system", "content": system}]
    pauses = think_times(index, args.turns, args.think_s)
    for turn, user in enumerate(user_turns(index, args.turns)):
        await asyncio.sleep(pauses[turn])
        messages.append({"role": "user", "content": user})
        body = {"model": "m", "messages": messages, "stream": True, "stream_options": {"include_usage": True},
                "max_tokens": args.max_tokens, "temperature": 0, "logit_bias": bias}  # fmt: skip
        ttft, answer, usage, instance, why = await turn_request(client, body)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        result.turns.append(Turn(index, turn, ttft, usage.get("prompt_tokens", 0), cached, instance, why))
        messages.append({"role": "assistant", "content": answer})


async def run_workload(router_url: str, args, systems: list[str], bias: dict, policy: str) -> RunResult:
    result = RunResult(policy, 0.0)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(args.conversations):
        queue.put_nowait(index)

    async def user(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            index = queue.get_nowait()
            await conversation(client, index, systems[index % len(systems)], args, bias, result)

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=router_url, timeout=900) as client:
        await asyncio.gather(*(user(client) for _ in range(args.concurrency)))
    result.wall_s = time.perf_counter() - started
    return result


def report(result: RunResult) -> str:
    ttfts = sorted(t.ttft_s * 1000 for t in result.turns)
    prompt = sum(t.prompt_tokens for t in result.turns)
    cached = sum(t.cached_tokens for t in result.turns)
    served: dict[str, int] = {}
    whys: dict[str, int] = {}
    for t in result.turns:
        served[t.instance] = served.get(t.instance, 0) + 1
        whys[t.why] = whys.get(t.why, 0) + 1
    return (
        f"{result.policy:<12} {len(result.turns):>5} {prompt:>8} {cached:>8} {cached / max(1, prompt):>7.1%} "
        f"{(prompt - cached) / len(result.turns):>9.0f} {statistics.fmean(ttfts):>9.0f} "
        f"{statistics.median(ttfts):>8.0f} {ttfts[int(0.9 * (len(ttfts) - 1))]:>8.0f} {result.wall_s:>7.1f}  "
        f"{sorted(served.values())} {whys}"
    )


def by_turn(result: RunResult, turns: int) -> str:
    """Mean TTFT (ms) and uncached prompt tokens per turn index."""
    cells = []
    for n in range(turns):
        rows = [t for t in result.turns if t.turn == n]
        ttft = statistics.fmean(t.ttft_s * 1000 for t in rows)
        cells.append(f"{ttft:.0f}ms/{statistics.fmean(t.prompt_tokens - t.cached_tokens for t in rows):.0f}tok")
    return f"{'':<12} per turn: " + "  ".join(cells)


def model_dir(models: Path) -> Path:
    """The random 85M Llama with a window of WINDOW (its weights linked from bench/random_model.py's)."""
    hf_dir, _ = write_random_llama(models / "stories260K-hf", models / "stories260K.gguf")
    out = hf_dir.parent / f"random85m-{WINDOW}-hf"
    out.mkdir(exist_ok=True)
    for path in hf_dir.iterdir():
        if path.name != "config.json" and not (out / path.name).exists():
            (out / path.name).symlink_to(path)
    config = json.loads((hf_dir / "config.json").read_text()) | {"max_position_embeddings": WINDOW}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    )
    parser.add_argument("--policies", default="least_busy,cache_aware")
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--systems", type=int, default=4)
    parser.add_argument("--system-sentences", type=int, default=10, help="a system prompt's reference sentences")
    parser.add_argument("--concurrency", type=int, default=8, help="conversations in flight at once")
    parser.add_argument("--max-tokens", type=int, default=64, help="an answer's length")
    parser.add_argument("--slots", type=int, default=8, help="each instance's max_concurrent")
    parser.add_argument("--think-s", type=float, default=2.0, help="a user's mean pause between turns")
    parser.add_argument("--threads", type=int, default=1, help="each instance's threads (OMP_NUM_THREADS)")
    args = parser.parse_args()
    path = model_dir(args.models)
    systems = system_prompts(args.systems, args.system_sentences)
    bias = whole_word_bias(path)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; {path.name}; {args}", flush=True)
    print(f"{'policy':<12} {'turns':>5} {'prompt':>8} {'cached':>8} {'hit':>7} {'uncached':>9} {'ttft_mean':>9} "
          f"{'p50':>8} {'p90':>8} {'wall_s':>7}  per instance, why")  # fmt: skip
    for policy in args.policies.split(","):
        router, servers = start_fleet(policy, path, args.slots, args.threads)
        try:
            result = asyncio.run(run_workload(router.url, args, systems, bias, policy))
        finally:
            for process in (*servers, router):
                process.stop()
        print(report(result), flush=True)
        print(by_turn(result, args.turns), flush=True)


if __name__ == "__main__":
    main()
