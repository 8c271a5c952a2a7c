"""Where a decode step's time goes, by kind of work: torch.profiler over decode steps of the random 85M Llama in each
GGUF format (bench/random_model.py), its self CPU time per op summed into groups (linear layers, attention (the C
kernel's RoPE and KV store included), the paged KV cache's writes and gathers, norms, SwiGLU, everything else), in ms
per step, next to the step's wall time and the batch-1 bandwidth floor (weight bytes per token / copy bandwidth, as
in bench/engine_bench.py). The wall time is the served step's (execution/decode_plan.py where the model has a plan, with
the threads step_threads.py gives a two-thread worker); the groups are the module forward's, whose calls the
profiler can label (`forward` is its wall time).

Run: .venv/bin/python bench/step_profile.py [--models DIR] [--batches 1,8,32] [--context 128] [--gguf FILE]...
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.engine_bench import copy_bandwidth_gbs  # noqa: E402
from bench.random_model import write_quantized_gguf, write_random_llama  # noqa: E402
from inference.engine.execution.step_threads import apply_step_threads, choose_step_threads  # noqa: E402
from inference.engine.kernels import matmul as matmul_kernel  # noqa: E402
from inference.engine.kernels import pointwise
from inference.engine.loaders.loading import linear_formats, load_model  # noqa: E402
from inference.engine.model import transformer  # noqa: E402

STEPS = 10
# The C kernels are no aten ops: each is profiled as a labelled range.
PAGED_KERNEL = "paged decode attention (C kernel)"
Q4_0_KERNEL = "block matmul (C kernel)"
FLOAT_KERNEL = "float32 matmul (C kernel)"
NORM_KERNEL = "RMSNorm (C kernel)"
SWIGLU_KERNEL = "SwiGLU (C kernel)"
GROUPS = {
    "linear": ("quantized::linear_dynamic", "mkldnn::_linear_pointwise", "aten::mm", "aten::addmm",
               "aten::_weight_int4pack_mm_for_cpu", "aten::linear", "aten::matmul", Q4_0_KERNEL, FLOAT_KERNEL),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
                  PAGED_KERNEL),
    "kv cache": ("aten::index_select", "aten::index_copy_"),
    "norms": ("aten::_fused_rms_norm", "aten::rms_norm", "aten::pow", "aten::mean", "aten::rsqrt", NORM_KERNEL),
    "swiglu": ("aten::silu", SWIGLU_KERNEL),
}  # fmt: skip


def labelled(kernel, label: str):
    def call(*args):
        with record_function(label):
            return kernel(*args)

    return call


def group_of(op: str) -> str:
    return next((group for group, ops in GROUPS.items() if op in ops), "other ops")


def profile_step(path: Path, batch: int, context: int) -> dict:
    loaded = load_model(path, max_concurrent=max(batch, 1), context_window=context + 4 * STEPS + 16)
    runner = loaded.runner
    slots = [runner.allocate_slot() for _ in range(batch)]
    gen = torch.Generator().manual_seed(0)
    for slot in slots:
        runner.prefill(slot, torch.randint(3, loaded.config.vocab_size, (context,), generator=gen).tolist())
    tokens = [5] * batch
    apply_step_threads(choose_step_threads(loaded.config, loaded.torch_matmuls, 2))

    def wall() -> float:
        for _ in range(3):
            runner.decode(slots, tokens)
        start = time.perf_counter()
        for _ in range(STEPS):
            runner.decode(slots, tokens)
        return 1000 * (time.perf_counter() - start) / STEPS

    wall_ms = wall()
    runner.plan = None
    forward_ms = wall()
    kernel = transformer.decode_attention
    transformer.decode_attention = labelled(kernel, PAGED_KERNEL)
    q4_0, rowwise = matmul_kernel.KERNEL, pointwise.KERNEL
    if q4_0 is not None:
        matmul_kernel.KERNEL = SimpleNamespace(
            matmul=labelled(q4_0.matmul, Q4_0_KERNEL),
            float_matmul=labelled(q4_0.float_matmul, FLOAT_KERNEL),
            block_layout=q4_0.block_layout,
            transposed_matmul=q4_0.transposed_matmul,
        )
    if rowwise is not None:
        pointwise.KERNEL = SimpleNamespace(
            rms_norm=labelled(rowwise.rms_norm, NORM_KERNEL), swiglu=labelled(rowwise.swiglu, SWIGLU_KERNEL)
        )
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(STEPS):
                runner.decode(slots, tokens)
    finally:
        transformer.decode_attention, pointwise.KERNEL = kernel, rowwise
        matmul_kernel.KERNEL = q4_0
    groups: dict[str, float] = {}
    for event in prof.key_averages():
        groups[group_of(event.key)] = groups.get(group_of(event.key), 0.0) + event.self_cpu_time_total / 1000 / STEPS
    return {
        "wall_ms": wall_ms,
        "forward_ms": forward_ms,
        "groups": groups,
        "weight_bytes": loaded.weight_bytes,
        "formats": linear_formats(runner.model),
    }


def main() -> None:
    repo = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", repo.parent / "shared" / "models"))
    )
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--context", type=int, default=128, help="tokens each sequence holds before the steps")
    parser.add_argument(
        "--gguf",
        action="append",
        default=[],
        type=Path,
        help="another GGUF file of the random 85M model (a K-quant that llama.cpp's llama-quantize wrote), labelled "
        "by its stem's last part; repeatable",
    )
    args = parser.parse_args()
    stories_hf, stories_gguf = args.models / "stories260K-hf", args.models / "stories260K.gguf"
    _, f32 = write_random_llama(stories_hf, stories_gguf)
    models = [("F32", f32), *((q, write_quantized_gguf(stories_hf, stories_gguf, q)) for q in ("Q8_0", "Q4_0"))]
    models += [(path.stem.rsplit("-", 1)[-1], path) for path in args.gguf]
    bandwidth = copy_bandwidth_gbs()
    print(f"{torch.get_num_threads()} threads; copy bandwidth {bandwidth:.1f} GB/s; ms per decode step")
    names = [*GROUPS, "other ops"]
    print(f"{'model':<7} {'batch':>5} {'wall':>7} {'forward':>7} {'floor':>6} " + " ".join(f"{n:>10}" for n in names))
    for label, path in models:
        for batch in (int(b) for b in args.batches.split(",")):
            row = profile_step(path, batch, args.context)
            floor = 1000 * row["weight_bytes"] / (bandwidth * 1e9)
            cells = " ".join(f"{row['groups'].get(n, 0.0):>10.2f}" for n in names)
            print(
                f"{label:<7} {batch:>5} {row['wall_ms']:>7.2f} {row['forward_ms']:>7.2f} {floor:>6.2f} {cells}  "
                f"{row['formats']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
