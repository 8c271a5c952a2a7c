"""Each C kernel against torch's own way of doing the same work on this CPU, at decode sizes: microseconds per call,
the two paths alternated round after round (the host is shared), the median of the rounds.

    .venv/bin/python bench/kernels_vs_torch.py [--threads 1] [--rounds 15] [--inductor]

Rows are (kernel, shape, rows, µs kernel, µs torch, torch / kernel). Torch's side is what the engine would run
without the kernel (PANTHEON_KERNELS=off) and the other forms torch offers: eager ops, oneDNN's reordered linear
(PackedLinear), fbgemm's dynamic int8 (DynamicInt8Linear), the int4 kernel (`_weight_int4pack_mm_for_cpu`, Int4Linear)
and, with --inductor, torch.compile of the pointwise work. docs/development.md has the figures and the decisions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from inference.engine import kernels  # noqa: E402
from inference.engine.model.transformer import PackedLinear, TransposedLinear, rotate_half  # noqa: E402
from inference.engine.quant.block_quant import Q4_0Linear, Q8_0Linear  # noqa: E402
from inference.engine.quant.int4 import Int4Linear  # noqa: E402
from inference.engine.quant.quantize import DynamicInt8Linear  # noqa: E402

HIDDEN, FFN = 896, 4864  # Qwen2.5-0.5B's widths
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 14, 2, 64, 16


def per_call_us(fn: Callable[[], object], budget_s: float) -> float:
    """Microseconds per call of `fn`, called for about `budget_s` after a warm-up."""
    fn()
    start, calls = time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - start < budget_s:
        fn()
        calls += 1
    return 1e6 * (time.perf_counter() - start) / calls


def compare(
    ours: Callable[[], object], theirs: Callable[[], object], rounds: int, budget_s: float
) -> tuple[float, float]:
    """Median µs per call of each, alternating which goes first each round."""
    a, b = [], []
    for r in range(rounds):
        order = [(ours, a), (theirs, b)] if r % 2 == 0 else [(theirs, b), (ours, a)]
        for fn, out in order:
            out.append(per_call_us(fn, budget_s))
    return statistics.median(a), statistics.median(b)


def linear_cases(rows: int, out_features: int, in_features: int):
    """(kernel, torch form, kernel call, torch call) for one float32 weight's product."""
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=False)
    x = torch.randn(rows, in_features)
    weight = linear.weight.detach().contiguous()
    out = torch.empty(rows, out_features)
    float_call = lambda: kernels.float_matmul(out, x, weight)  # noqa: E731
    packed = PackedLinear(linear)
    yield "float_matmul", "F.linear (MKL)", float_call, lambda: F.linear(x, weight)
    yield "float_matmul", "oneDNN packed", float_call, lambda: packed(x)
    q4, int4 = Q4_0Linear(linear), Int4Linear(linear)
    yield "block_matmul q4_0", "int4pack_mm", lambda: q4(x), lambda: int4(x)
    yield "block_matmul q4_0", "oneDNN packed f32", lambda: q4(x), lambda: packed(x)
    q8, int8 = Q8_0Linear(linear), DynamicInt8Linear(linear)
    yield "block_matmul q8_0", "fbgemm int8 dynamic", lambda: q8(x), lambda: int8(x)


def transposed_cases(rows: int, out_features: int, in_features: int):
    torch.manual_seed(0)
    layer = TransposedLinear(nn.Linear(in_features, out_features, bias=False))
    x = torch.randn(rows, in_features)
    out = torch.empty(rows, out_features)
    yield (
        "transposed_matmul",
        "torch.matmul",
        lambda: kernels.transposed_matmul(out, x, layer.weight_t),
        lambda: torch.matmul(x, layer.weight_t, out=out),
    )


def pointwise_cases(rows: int, inductor: bool):
    torch.manual_seed(0)
    x, residual, weight = torch.randn(rows, HIDDEN), torch.randn(rows, HIDDEN), torch.randn(HIDDEN)
    out = torch.empty(rows, HIDDEN)
    gate_up, act = torch.randn(rows, 2 * FFN), torch.empty(rows, FFN)

    def torch_norm():
        x.add_(residual)
        return torch.rms_norm(x, weight.shape, weight, 1e-6)

    def torch_swiglu():
        gate, up = gate_up.chunk(2, -1)
        return F.silu(gate) * up

    norm_call = lambda: kernels.rms_norm_into(out, x, weight, 1e-6, residual)  # noqa: E731
    swiglu_call = lambda: kernels.swiglu_into(act, gate_up)  # noqa: E731
    yield "rms_norm (+residual)", "eager add_ + rms_norm", norm_call, torch_norm
    yield "swiglu", "eager silu * up", swiglu_call, torch_swiglu
    if inductor:
        norm_c, swiglu_c = torch.compile(torch_norm, dynamic=False), torch.compile(torch_swiglu, dynamic=False)
        yield "rms_norm (+residual)", "inductor", norm_call, norm_c
        yield "swiglu", "inductor", swiglu_call, swiglu_c


def attention_cases(rows: int, tokens: int):
    """The paged kernel against the torch path the engine takes without it: rotate, store, gather the rows' blocks
    into one buffer, SDPA with each row's length masked."""
    torch.manual_seed(0)
    group, per_row = HEADS // KV_HEADS, -(-(tokens + 1) // BLOCK)
    pool_blocks = rows * per_row
    keys = torch.randn(KV_HEADS, pool_blocks, BLOCK, HEAD_DIM)
    values = torch.randn(KV_HEADS, pool_blocks, BLOCK, HEAD_DIM)
    table = torch.arange(pool_blocks).view(rows, per_row)
    lengths = torch.full((rows,), tokens + 1)
    new = lengths - 1
    block = table[torch.arange(rows), new // BLOCK]
    write_rows = torch.stack([(h * pool_blocks + block) * BLOCK + new % BLOCK for h in range(KV_HEADS)], 1).reshape(-1)
    qkv = torch.randn(rows, HEADS + 2 * KV_HEADS, HEAD_DIM)
    angles = torch.randn(rows, HEAD_DIM // 2)
    cos, sin = torch.cat((angles, angles), -1).cos(), angles.sin()
    sin_signed = torch.cat((-sin, sin), -1)
    out = torch.empty(rows, HEADS * HEAD_DIM)
    positions = torch.arange(per_row * BLOCK)
    mask = (positions[None, :] < lengths[:, None])[:, None, None, :]  # [B, 1, 1, L]
    flat_k, flat_v = keys.view(-1, HEAD_DIM), values.view(-1, HEAD_DIM)

    def torch_path():
        qk = rotate_half(qkv[:, : HEADS + KV_HEADS], cos[:, None], sin_signed[:, None])
        q, k = qk.split_with_sizes((HEADS, KV_HEADS), dim=1)
        flat_k.index_copy_(0, write_rows, k.reshape(-1, HEAD_DIM))
        flat_v.index_copy_(0, write_rows, qkv[:, HEADS + KV_HEADS :].reshape(-1, HEAD_DIM))
        k_rows = keys.index_select(1, table.reshape(-1)).view(KV_HEADS, rows, -1, HEAD_DIM).transpose(0, 1)
        v_rows = values.index_select(1, table.reshape(-1)).view(KV_HEADS, rows, -1, HEAD_DIM).transpose(0, 1)
        q = q.view(rows, KV_HEADS, group, HEAD_DIM)
        return F.scaled_dot_product_attention(q, k_rows, v_rows, attn_mask=mask).reshape(rows, -1)

    kernel = lambda: kernels.attend_into(out, qkv, cos, sin_signed, keys, values, write_rows, table, lengths)  # noqa: E731
    yield "paged_attention", f"rope+store+gather+SDPA, {tokens} tok", kernel, torch_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch's threads and the kernels' pool alike")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--budget", type=float, default=0.05, help="seconds per measurement")
    parser.add_argument("--inductor", action="store_true", help="also torch.compile the pointwise work")
    parser.add_argument("--only", help="run only the kernels whose name contains this")
    args = parser.parse_args()
    if not kernels.active_kernels():
        sys.exit("the C kernels are off or not built: nothing to compare")
    torch.set_num_threads(args.threads)
    kernels.set_threads(args.threads)
    print(f"# torch {torch.__version__}, {args.threads} thread(s), kernels: {kernels.describe()}")
    print(f"{'kernel':22} {'torch form':34} {'shape':>12} {'rows':>4} {'µs C':>9} {'µs torch':>9} {'torch/C':>7}")
    cases = []
    for rows in (1, 8):
        for out_features, in_features in ((FFN, HIDDEN), (HIDDEN, FFN)):
            cases += [(c, f"{out_features}x{in_features}", rows) for c in linear_cases(rows, out_features, in_features)]
        cases += [(c, "64x64", rows) for c in transposed_cases(rows, 64, 64)]
        cases += [(c, "288x288", rows) for c in transposed_cases(rows, 288, 288)]
        cases += [(c, f"{HIDDEN}/{FFN}", rows) for c in pointwise_cases(rows, args.inductor)]
    for rows, tokens in ((1, 256), (4, 256), (8, 512)):
        cases += [(c, f"{HEADS}h/{KV_HEADS}kv", rows) for c in attention_cases(rows, tokens)]
    for (name, form, ours, theirs), shape, rows in cases:
        if args.only and args.only not in name:
            continue
        c_us, torch_us = compare(ours, theirs, args.rounds, args.budget)
        print(f"{name:22} {form:34} {shape:>12} {rows:>4} {c_us:9.1f} {torch_us:9.1f} {torch_us / c_us:7.2f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
