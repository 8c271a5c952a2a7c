"""A one-shot check of the engine on a CUDA machine, made for a lent GPU with minutes of budget and no network: the
card's own bandwidth and matmul rate, the fidelity of both attention paths ("gather", "flex"), and the engine at real
sizes (Llama-3.2-1B's and Qwen3-8B's shapes, random bfloat16 weights made on the GPU: real_model.py), each row
against its bound (rows.py):

- the card (card.py): a large device-to-device copy and a large matmul, beside the maker's figure where known;
- fidelity (fidelity.py): a small random Llama written as a Hugging Face checkpoint, both attention paths against
  each other, the engine in float32 on the CPU and transformers; then, per real shape, flex against gather and the
  decode graphs against the eager decode; and a load with default options (HostedModel.load);
- decode at batch 64 with 2k-token contexts (issue 40's done-when row), per shape and attention path;
- prefill: 8 prompts of 2048 tokens in one batch;
- the grid: decode at batch 1 / 8 / 64 / 256 with 512- and 4096-token contexts.

That order puts what a cut-off run must not lose first; every row prints as a table line and a JSON line the moment it
is measured, and the whole table again at the end. Decode steps run as CUDA graphs (compile_decode) where they
capture. Run it through bench/gpu_check.sh, which finds a Python whose torch sees the GPU. `--device cpu --shape
tiny` runs every code path on a CPU in float32 with scaled-down shapes, in seconds (graphs off: inductor takes
~10 s a bucket there; `--graphs on` runs them anyway).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from card import Card, describe, measure_card  # noqa: E402
from fidelity import shape_fidelity, small_fidelity, write_checkpoint  # noqa: E402
from random_model import SHAPES as SMALL_SHAPES  # noqa: E402
from real_model import SHAPES, RandomModel, build_random  # noqa: E402
from rows import TABLE_HEADER, Settings, decode_rows, prefill_row, skipped, table_line, window_for  # noqa: E402

PARTS = ("fidelity", "done", "prefill", "grid")
ATTENTION = ("gather", "flex")


@dataclass(frozen=True, slots=True)
class Scale:
    """One size of the whole run: real shapes for a GPU, tiny ones that run every path on a CPU in seconds."""

    models: tuple[str, ...]
    small: dict[str, int]  # the small Llama of the transformers comparison
    fidelity_prompt: tuple[int, int]  # the real shapes' long fidelity prompt: tokens, prefilled this many at a time
    done: tuple[int, int]  # the done-when row: batch, context
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    prefill: tuple[int, int]  # prompts, tokens each
    steps: int  # timed decode steps per row
    prefill_repeats: int
    copy_bytes: int  # the card's bandwidth copy
    matmul_size: int  # the card's matmul


SCALES = {
    "real": Scale(
        models=("llama-3.2-1b", "qwen3-8b"), small=SMALL_SHAPES["random85m"], fidelity_prompt=(700, 256),
        done=(64, 2048), batches=(1, 8, 64, 256), contexts=(512, 4096), prefill=(8, 2048), steps=16,
        prefill_repeats=3, copy_bytes=1 << 30, matmul_size=8192,
    ),
    "tiny": Scale(
        models=("tiny-llama", "tiny-qwen3"),
        small={"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256},
        fidelity_prompt=(60, 16), done=(4, 64), batches=(1, 4), contexts=(32, 128), prefill=(2, 64), steps=4,
        prefill_repeats=1, copy_bytes=32 << 20, matmul_size=256,
    ),
}  # fmt: skip


def emit(line: dict, rows: list[dict] | None = None) -> None:
    """A row as a table line and a JSON line, kept in `rows` for the final table."""
    if rows is not None:
        print(table_line(line))
        rows.append(line)
    print(json.dumps(line))


def release() -> None:
    """Frees what the last runner held (its graphs reference each other: only the collector finds them)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Models:
    """The one random model held at a time: asking for another frees it first."""

    def __init__(self, device: torch.device, dtype: torch.dtype, positions: int):
        self.device, self.dtype, self.positions = device, dtype, positions
        self.built: RandomModel | None = None

    def get(self, name: str) -> RandomModel:
        if self.built is None or self.built.name != name:
            self.built = None
            release()
            started = time.perf_counter()
            self.built = build_random(name, self.device, self.dtype, self.positions)
            print(f"built {name} in {time.perf_counter() - started:.1f} s")
            emit(self.built.summary())
        return self.built


def guarded_rows(rows: list[dict], make, spec: dict) -> None:
    """Emits the rows `make()` yields; a row group that runs out of device memory becomes a skipped row."""
    try:
        for row in make():
            emit(row, rows)
    except torch.OutOfMemoryError as exc:
        emit({**spec, "skipped": f"out of memory: {str(exc).splitlines()[0]}"}, rows)
    finally:
        release()


def run_stage(part: str, name: str, models: Models, card: Card, args, scale: Scale, settings: Settings, rows: list):
    """One part of the run for one model, every attention path."""
    built = models.get(name)
    if part == "fidelity":
        shape_fidelity(built, *scale.fidelity_prompt, settings.graphs)
        return
    print(TABLE_HEADER)
    for attention in args.attention:
        if part == "prefill":
            prompts, tokens = scale.prefill
            make = partial(prefill_row, built, card, attention, prompts, tokens, scale.prefill_repeats)
            guarded_rows(rows, lambda make=make: [make()], skipped("prefill", built, attention, prompts, tokens, ""))
            continue
        work = [(scale.done[1], [scale.done[0]])] if part == "done" else [(c, args.batches) for c in args.contexts]
        for context, batches in work:
            make = partial(decode_rows, built, card, attention, context, batches, settings)
            guarded_rows(rows, make, skipped("decode", built, attention, max(batches), context, ""))


def stages(models: list[str], parts: list[str]) -> list[tuple[str, str]]:
    """(part, model) in the run's order: each model's fidelity and done-when row before any model's other rows."""
    first = [(part, model) for model in models for part in ("fidelity", "done") if part in parts]
    rest = [(part, model) for model in models for part in ("prefill", "grid") if part in parts]
    return first + rest


def print_environment(device: torch.device) -> None:
    try:
        transformers_version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        transformers_version = "not installed"
    print(
        f"python {platform.python_version()}, torch {torch.__version__} (built for CUDA {torch.version.cuda}), "
        f"transformers {transformers_version}; torch.cuda.is_available(): {torch.cuda.is_available()}"
    )
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        print(
            f"device: {props.name}, capability {props.major}.{props.minor}, {props.total_memory / 2**30:.1f} GiB, "
            f"{props.multi_processor_count} SMs"
        )
    else:
        print(f"device: cpu ({platform.processor() or platform.machine()}), {os.cpu_count()} cpus")
    run = {"kind": "run", "date": datetime.date.today().isoformat(), "torch": torch.__version__}
    emit(run | {"commit": commit()})


def commit() -> str:
    """The commit measured: GPU_CHECK_COMMIT where the tree was copied without its history, else git's."""
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    except OSError:  # no git on the machine
        return "unknown"
    return done.stdout.strip() or "unknown"


def check_default_load(path: Path, device: torch.device) -> None:
    """The worker's load with every option left at its default (HostedModel.load, as `manage.py load_model` with no
    flags): on CUDA its decode step is captured all the same, and this is the report /admin/models shows. Imported
    here: the worker's side needs msgspec and llguidance, which a bare GPU image may lack, and the rest does not."""
    from inference.engine.contract import messages as p
    from inference.engine.contract.params import LoadOptions, ServingLimits
    from inference.engine.hosted_model import HostedModel

    req = p.Load(
        request_id="gpu-check", name="gpu-check", path=str(path), options=LoadOptions(), limits=ServingLimits()
    )
    started = time.perf_counter()
    hosted = HostedModel.load(req, str(device))
    graphs = hosted.decode_graphs()
    print(
        f"loaded in {time.perf_counter() - started:.1f} s; graphs: mode {graphs.mode}, buckets {graphs.buckets}, "
        f"warm-up {graphs.warmup_ms:.0f} ms, fallback reason {graphs.fallback_reason}"
    )


def section(title: str, check, *args):
    """Prints the title, then runs the check; a failure is printed with its traceback and the run goes on (one
    failed part must not cost the rest of a lent machine's minutes). The check's result, or None if it failed."""
    print(f"== {title}")
    try:
        return check(*args)
    except Exception:
        traceback.print_exc(file=sys.stdout)
        return None
    finally:
        release()


def names(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def numbers(text: str) -> list[int]:
    return [int(part) for part in names(text)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: every path, float32")
    parser.add_argument("--shape", choices=SCALES, default="real", help="tiny: scaled-down shapes, quick on a CPU")
    parser.add_argument("--models", type=names, help=f"comma-separated, of {', '.join(SHAPES)} (default: the scale's)")
    parser.add_argument("--parts", type=names, default=list(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--attention", type=names, default=list(ATTENTION), help="comma-separated: gather,flex")
    parser.add_argument("--batches", type=numbers, help="the grid's decode batches, comma-separated")
    parser.add_argument("--contexts", type=numbers, help="the grid's decode contexts, comma-separated")
    parser.add_argument("--steps", type=int, help="timed decode steps per row")
    parser.add_argument("--graphs", choices=("auto", "on", "off"), default="auto", help="auto: on on CUDA only")
    parser.add_argument(
        "--window",
        type=int,
        help="a serving window for every decode row (default: each row's context and steps)",
    )
    args = parser.parse_args()
    scale = SCALES[args.shape]
    args.models = args.models or list(scale.models)
    args.batches = args.batches or list(scale.batches)
    args.contexts = args.contexts or list(scale.contexts)
    unknown = set(args.models) - set(SHAPES) | set(args.parts) - set(PARTS) | set(args.attention) - set(ATTENTION)
    if unknown:
        parser.error(f"unknown names: {', '.join(sorted(unknown))}")
    return args


def main() -> int:
    args = parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    device, scale = torch.device(args.device), SCALES[args.shape]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    graphs = args.graphs == "on" or (args.graphs == "auto" and device.type == "cuda")
    settings = Settings(steps=args.steps or scale.steps, graphs=graphs, window=args.window)
    print("== environment")
    print_environment(device)
    title = f"the card ({str(dtype).removeprefix('torch.')})"
    card = section(title, measure_card, device, dtype, scale.copy_bytes, scale.matmul_size)
    if card is None:
        return 1
    print(describe(card))
    emit(card.summary())
    if "fidelity" in args.parts:
        with tempfile.TemporaryDirectory(prefix="pantheon-gpu-check-") as tmp:
            path = write_checkpoint(Path(tmp), scale.small)
            section(f"fidelity: a small random Llama ({device.type})", small_fidelity, path, device, dtype, graphs)
            section("a load with the default options (HostedModel.load)", check_default_load, path, device)
    contexts = [*args.contexts, scale.done[1]]
    positions = max(*(window_for(context, settings) for context in contexts), scale.prefill[1], 1024)  # RoPE rows
    models, rows = Models(device, dtype, positions), []
    for part, name in stages(args.models, args.parts):
        section(f"{part}: {name}", run_stage, part, name, models, card, args, scale, settings, rows)
    print("== every row (ratio: to the bound from the measured card; nominal: from the maker's figure)")
    print(TABLE_HEADER)
    for row in rows:
        print(table_line(row))
    if device.type == "cuda":
        print(f"peak CUDA memory allocated: {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
