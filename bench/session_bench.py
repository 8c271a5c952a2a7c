"""Sessions on the paged KV cache: what a warm turn saves, and what the paged layout costs decode.

Two measurements on the random ~85M-parameter Llama (bench/random_model.py), engine only (no HTTP, no IPC):

1. Time to first token of a session turn, cold against warm. Cold: a fresh session id and a 2,000-token prompt of
   random token ids no earlier request used, so neither a session nor the prefix cache holds any of it. Warm: the
   next turn of that session, whose prompt is the cold turn's prompt + its output + 20 new tokens, so only the new
   tokens are prefilled. Requests go through the scheduler as the worker submits them (`Sequence` with a session
   id, `SessionTable.claim`, `Scheduler.add`, then `step()` until the turn's first token), once with the server's
   default prefill chunk (128 tokens per step) and once with a chunk that takes the whole prompt in one step.
   The issue's target: warm <= 10% of cold.

2. Decode tokens/s at N = 1 and N = 8 sequences, at short context (32-token prompts) and at 2,000 tokens of
   context, on this tree and on another one (`--before`, e.g. a git worktree of the commit before the paged
   layout), measured alternately in one sitting. Each tree runs in a subprocess of its own (this file with
   `--decode-worker`, the engine imported from that tree) that loads the model once and answers one measurement
   per request, so the two trees take turns on the same cores; only the runner API both layouts share is used
   (`ModelRunner.allocate_slot/prefill/decode/truncate/free_slot`). The target: within 10% of before at short
   context. The paged layout reads a batch's keys by gathering its blocks (a copy per layer per step), where the
   slab read a slice of consecutive slots, so long contexts are where it can cost.

The benchmark model's config says 1,024 positions; its weights are random, so the bench serves the same files under
a config that allows 4,096 (var/bench/random85m-4k-hf, links to the same weights). Results go in
docs/performance.md. Run:

    .venv/bin/python bench/session_bench.py [--before /tmp/wt-before] [--rounds 5] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent

HISTORY_TOKENS = 2000  # the cold turn's prompt
TURN_OUTPUT = 16  # tokens the cold turn generates before the warm one
NEW_TOKENS = 20  # the warm turn's new message
SERVER_CHUNK = 128  # the server's default prefill chunk (PANTHEON_PREFILL_CHUNK)
SHORT_PROMPT = 32
DECODE_STEPS = 32
DECODE_SLOTS = 8
LONG_CONTEXT_LIMIT = 4096


def random_tokens(gen: torch.Generator, vocab: int, count: int) -> list[int]:
    """Token ids 3..vocab-1 (past BOS/EOS/UNK): random text no other request shares."""
    return torch.randint(3, vocab, (count,), generator=gen).tolist()


def long_context_model(random_hf: Path) -> Path:
    """The benchmark model's files under a config that allows LONG_CONTEXT_LIMIT positions (links, not copies)."""
    out = random_hf.parent / "random85m-4k-hf"
    out.mkdir(exist_ok=True)
    for source in random_hf.iterdir():
        link = out / source.name
        if source.name != "config.json" and not link.exists():
            link.symlink_to(source.resolve())
    config = json.loads((random_hf / "config.json").read_text())
    config["max_position_embeddings"] = LONG_CONTEXT_LIMIT
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


# -- 1. time to first token, cold and warm (this tree) ----------------------------------------------------------


def session_ttft(model_dir: Path, chunk: int, repeats: int, seed: int) -> list[dict]:
    """`repeats` (cold, warm) pairs after one discarded warm-up pair; seconds from `Scheduler.add` to the step that
    returns the turn's first token, and the prompt tokens each turn found cached."""
    from inference.engine.contract.params import GenerationOptions, SamplingParams
    from inference.engine.kv.sessions import SessionTable
    from inference.engine.loaders.loading import load_model
    from inference.engine.sampler import SequenceSampling
    from inference.engine.scheduler import Scheduler
    from inference.engine.sequence import Sequence
    from inference.engine.step_results import Admitted, Streamed
    from inference.engine.text.detokenizer import IncrementalDetokenizer

    model = load_model(model_dir, max_concurrent=DECODE_SLOTS, context_window=LONG_CONTEXT_LIMIT)
    runner = model.runner
    sessions = SessionTable(runner.cache, max_sessions=16, idle_ttl=3600.0, watch_grace=45.0)
    scheduler = Scheduler(
        runner, model.tokenizer, max_concurrent=DECODE_SLOTS, queue_depth=8, prefill_chunk=chunk, sessions=sessions
    )
    greedy = SamplingParams(temperature=0.0)
    gen = torch.Generator().manual_seed(seed)

    def submit(request_id: str, session_id: str, prompt: list[int], max_tokens: int) -> Sequence:
        seq = Sequence(
            request_id,
            prompt,
            sampling=SequenceSampling(greedy, runner.vocab_size),
            detokenizer=IncrementalDetokenizer(model.tokenizer),
            options=GenerationOptions(max_tokens=max_tokens),
            context_window=runner.context_window,
            session_id=session_id,
        )
        seq.session = sessions.claim(session_id)
        scheduler.add(seq)
        return seq

    def first_token(request_id: str) -> tuple[float, int]:
        start, cached = time.perf_counter(), -1
        while True:
            for message in scheduler.step():
                if isinstance(message, Admitted) and message.request_id == request_id:
                    cached = message.cached_tokens
                if isinstance(message, Streamed) and message.request_id == request_id:
                    return time.perf_counter() - start, cached

    rows = []
    for rep in range(repeats + 1):
        session_id = f"session-{chunk}-{rep}"
        prompt = random_tokens(gen, runner.vocab_size, HISTORY_TOKENS)
        cold = submit(f"cold-{rep}", session_id, prompt, TURN_OUTPUT)
        cold_s, cold_cached = first_token(cold.request_id)
        while scheduler.has_work:  # the rest of the turn, and the step that keeps its last token's KV
            scheduler.step()
        warm_prompt = prompt + cold.output_ids + random_tokens(gen, runner.vocab_size, NEW_TOKENS)
        warm = submit(f"warm-{rep}", session_id, warm_prompt, 1)
        warm_s, warm_cached = first_token(warm.request_id)
        while scheduler.has_work:
            scheduler.step()
        sessions.release(session_id)
        if rep:  # the first pair warms up the allocator and oneDNN's kernels
            rows.append(
                {
                    "cold_s": cold_s,
                    "warm_s": warm_s,
                    "cold_cached": cold_cached,
                    "warm_cached": warm_cached,
                    "warm_prompt": len(warm_prompt),
                }
            )
    return rows


# -- 2. decode tokens/s, one tree per subprocess ----------------------------------------------------------------


def decode_worker(engine_root: Path, model_dir: Path) -> None:
    """Loads the model with the engine of `engine_root`, prefills the long-context slots, then answers each JSON
    request line on stdin ({"batch": N, "context": "short" | "long"}) with one measurement line on stdout."""
    sys.path.insert(0, str(engine_root))
    import inference
    from inference.engine.loaders.loading import load_model

    window = HISTORY_TOKENS + DECODE_STEPS + 2 * SHORT_PROMPT
    model = load_model(model_dir, max_concurrent=2 * DECODE_SLOTS, context_window=window)
    runner, vocab = model.runner, model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    long_slots = [runner.allocate_slot() for _ in range(DECODE_SLOTS)]
    long_last = [int(runner.prefill(slot, random_tokens(gen, vocab, HISTORY_TOKENS)).argmax()) for slot in long_slots]
    reply({"ready": True, "engine": str(Path(inference.__file__).resolve().parent.parent)})

    for line in sys.stdin:
        request = json.loads(line)
        batch = request["batch"]
        if request["context"] == "long":
            slots, tokens = long_slots[:batch], long_last[:batch]
        else:
            slots = [runner.allocate_slot() for _ in range(batch)]
            tokens = [int(runner.prefill(s, random_tokens(gen, vocab, SHORT_PROMPT)).argmax()) for s in slots]
        tokens = runner.decode(slots, tokens).argmax(-1).tolist()  # warm-up step
        profile = None
        if request.get("profile"):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                tokens = runner.decode(slots, tokens).argmax(-1).tolist()
            profile = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
        start = time.perf_counter()
        for _ in range(DECODE_STEPS):
            tokens = runner.decode(slots, tokens).argmax(-1).tolist()
        seconds = time.perf_counter() - start
        contiguous = reads_as_view(runner.cache, slots)
        if request["context"] == "long":
            for slot in slots:
                runner.truncate(slot, HISTORY_TOKENS)
        else:
            for slot in slots:
                runner.free_slot(slot)
        reply(
            {
                "tok_s": batch * DECODE_STEPS / seconds,
                "ms_per_step": 1000 * seconds / DECODE_STEPS,
                "view": contiguous,
                "profile": profile,
            }
        )


def reads_as_view(cache, slots: list[int]) -> bool:
    """Whether the step reads the slots' keys without a copy: consecutive slots of the slab layout, or a lone
    slot whose blocks are consecutive in the paged one."""
    if not hasattr(cache, "blocks"):  # the slab layout
        return slots == list(range(slots[0], slots[0] + len(slots)))
    blocks = cache.blocks(slots[0])
    return len(slots) == 1 and blocks == list(range(blocks[0], blocks[0] + len(blocks)))


def reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class DecodeTree:
    """A decode worker subprocess for one tree."""

    def __init__(self, label: str, root: Path, model_dir: Path, threads: int):
        self.label, self.root = label, root
        env = {**os.environ, "PYTHONPATH": str(root)}
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--decode-worker",
            "--engine-root",
            str(root),
            "--model",
            str(model_dir),
            "--threads",
            str(threads),
        ]
        self.process = subprocess.Popen(
            command, cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.ready = self._read()
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        self.commit = commit or "?"

    def measure(self, batch: int, context: str, profile: bool = False) -> dict:
        self.process.stdin.write(json.dumps({"batch": batch, "context": context, "profile": profile}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.label} decode worker ({self.root}) exited: {self.process.wait()}")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    )
    parser.add_argument("--before", type=Path, help="another tree's root, measured alternately with this one")
    parser.add_argument("--rounds", type=int, default=5, help="decode measurements per tree and configuration")
    parser.add_argument("--ttft-repeats", type=int, default=5, help="cold/warm pairs per prefill chunk")
    parser.add_argument("--chunks", default=f"{SERVER_CHUNK},{HISTORY_TOKENS + 48}", help="prefill chunks for TTFT")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--skip-ttft", action="store_true")
    parser.add_argument("--profile", action="store_true", help="profile one decode step per tree at N=8, long")
    parser.add_argument("--decode-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine-root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.decode_worker:
        decode_worker(args.engine_root, args.model)
        return

    sys.path.insert(0, str(REPO / "bench"))
    from random_model import write_random_llama

    stories_hf, stories_gguf = args.models / "stories260K-hf", args.models / "stories260K.gguf"
    random_hf, _ = write_random_llama(stories_hf, stories_gguf)
    model_dir = long_context_model(random_hf)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}, "
        f"{args.threads} threads; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )

    if not args.skip_ttft:
        sys.path.insert(0, str(REPO))
        print(
            f"\nTTFT, {HISTORY_TOKENS}-token history, {TURN_OUTPUT} output tokens, {NEW_TOKENS} new tokens "
            f"(median (min-max) of {args.ttft_repeats})"
        )
        print(f"{'chunk':>6} {'cold ms':>22} {'warm ms':>18} {'warm/cold':>10} {'cached cold/warm':>17}")
        for chunk in (int(c) for c in args.chunks.split(",")):
            rows = session_ttft(model_dir, chunk, args.ttft_repeats, seed=chunk)
            cold = [1000 * r["cold_s"] for r in rows]
            warm = [1000 * r["warm_s"] for r in rows]
            ratios = [w / c for w, c in zip(warm, cold, strict=True)]
            cached = f"{rows[0]['cold_cached']}/{rows[0]['warm_cached']} of {rows[0]['warm_prompt']}"
            print(
                f"{chunk:>6} {spread(cold, ',.0f'):>22} {spread(warm, '.1f'):>18} "
                f"{100 * statistics.median(ratios):>9.1f}% {cached:>17}",
                flush=True,
            )

    trees = [("after", REPO)] + ([("before", args.before.resolve())] if args.before else [])
    workers = [DecodeTree(label, root, model_dir, args.threads) for label, root in trees]
    for w in workers:
        print(f"{w.label}: {w.commit} engine from {w.ready['engine']}", flush=True)
    configs = [(1, "short"), (8, "short"), (1, "long"), (8, "long")]
    results: dict[tuple[str, int, str], list[dict]] = {}
    started = time.strftime("%H:%M", time.gmtime())
    for round_ in range(args.rounds):
        order = workers if round_ % 2 else workers[::-1]  # before first on even rounds, after first on odd ones
        for batch, context in configs:
            for w in order:
                results.setdefault((w.label, batch, context), []).append(w.measure(batch, context))
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    print(
        f"\ndecode, {DECODE_STEPS} greedy steps, {args.rounds} rounds alternated ({started}-"
        f"{time.strftime('%H:%M', time.gmtime())} UTC): tok/s median (min-max), ms/step median"
    )
    print(
        f"{'N':>3} {'context':>8} "
        + " ".join(f"{w.label + ' tok/s':>22} {'ms':>6}" for w in workers)
        + ("  after/before" if len(workers) > 1 else "")
        + "  reads as view"
    )
    for batch, context in configs:
        cells, medians = [], []
        for w in workers:
            runs = results[(w.label, batch, context)]
            tok_s = [r["tok_s"] for r in runs]
            medians.append(statistics.median(tok_s))
            cells.append(f"{spread(tok_s, '.1f'):>22} {statistics.median(r['ms_per_step'] for r in runs):>6.1f}")
        span = f"{SHORT_PROMPT}-{SHORT_PROMPT + DECODE_STEPS}" if context == "short" else f"{HISTORY_TOKENS}+"
        ratio = f"  {medians[0] / medians[1]:>12.2f}" if len(workers) > 1 else ""
        views = "/".join(f"{w.label} {results[(w.label, batch, context)][0]['view']}" for w in workers)
        print(f"{batch:>3} {span:>8} " + " ".join(cells) + ratio + f"  {views}")
    if args.profile:
        for w in workers:
            print(f"\n{w.label}, one decode step, N=8 at {HISTORY_TOKENS} tokens of context:")
            print(w.measure(DECODE_SLOTS, "long", profile=True)["profile"])
    for w in workers:
        w.close()


if __name__ == "__main__":
    main()
