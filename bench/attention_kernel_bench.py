"""The paged decode-attention kernel alone (kernels/paged_attention.py): one decode step's RoPE, KV store and
attention for N rows over every layer of the 85M model's shape (12 layers, 12 heads of 64, 16-position blocks, each
row's blocks interleaved with the others' as a lockstep batch takes them), per pool dtype and context length.

With --against PATH (another build of the extension, e.g. an older commit's .so) both builds run the same inputs,
round by round alternately, and their outputs are compared.

Run: .venv/bin/python bench/attention_kernel_bench.py [--rows 8] [--contexts 60,120,250]
     [--dtypes float32,float16,bfloat16] [--against OTHER.so]
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import inference.engine.kernels.paged_attention as paged_attention  # noqa: E402

LAYERS, HEADS, HEAD_DIM, BLOCK = 12, 12, 64, 16
ROUNDS = 40


def extension(path: str):
    loader = importlib.machinery.ExtensionFileLoader("other._paged_attention", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def step_inputs(rows: int, context: int, dtype: torch.dtype) -> tuple:
    torch.manual_seed(0)
    blocks = (context + BLOCK) // BLOCK  # room for the new position
    pool = rows * blocks
    layers = [tuple(torch.randn(HEADS, pool, BLOCK, HEAD_DIM).to(dtype) for _ in range(2)) for _ in range(LAYERS)]
    table = torch.arange(pool).view(blocks, rows).t().contiguous()
    lengths = torch.full((rows,), context + 1, dtype=torch.long)
    write_rows = torch.tensor([(h * pool + int(table[b, context // BLOCK])) * BLOCK + context % BLOCK
                               for b in range(rows) for h in range(HEADS)])  # fmt: skip
    qkv = torch.randn(rows, 3 * HEADS, HEAD_DIM)
    return layers, qkv, torch.ones(rows, HEAD_DIM), torch.zeros(rows, HEAD_DIM), write_rows, table, lengths


def step_ms(kernel, inputs: tuple) -> float:
    layers, qkv, cos, sin, write_rows, table, lengths = inputs
    paged_attention.KERNEL = kernel
    start = time.perf_counter()
    for keys, values in layers:
        paged_attention.decode_attention(qkv, cos, sin, keys, values, write_rows, table, lengths)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--contexts", default="60,120,250")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--against", help="another build of the _paged_attention extension")
    args = parser.parse_args()
    kernels = {"this": paged_attention.KERNEL}
    if args.against:
        kernels["other"] = extension(args.against)
    print(f"{args.rows} rows x {LAYERS} layers x {HEADS} heads of {HEAD_DIM}; median (min) ms per step")
    for dtype in args.dtypes.split(","):
        for context in (int(c) for c in args.contexts.split(",")):
            inputs = step_inputs(args.rows, context, getattr(torch, dtype))
            outs = {}
            for name, kernel in kernels.items():
                paged_attention.KERNEL = kernel
                layers, qkv, cos, sin, write_rows, table, lengths = inputs
                outs[name] = paged_attention.decode_attention(qkv, cos, sin, *layers[0], write_rows, table, lengths)
            times = {name: [] for name in kernels}
            for _ in range(ROUNDS):
                for name, kernel in kernels.items():
                    times[name].append(step_ms(kernel, inputs))
            cells = "  ".join(f"{n} {statistics.median(t):.3f} ({min(t):.3f})" for n, t in times.items())
            differ = ""
            if args.against:
                differ = f"  max |this - other| {float((outs['this'] - outs['other']).abs().max()):.2g}"
            print(f"{dtype:>8} at {context:>4} positions: {cells}{differ}")
    paged_attention.KERNEL = kernels["this"]


if __name__ == "__main__":
    main()
