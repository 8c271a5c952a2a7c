"""What the kernel pool's job lock (`_elastic_pool.h`) costs a decode step: the same steps on two builds of the
`_matmul` extension, alternating, each in a process of its own.

Each build given (`--kernel PATH`, a `_matmul*.so`; e.g. this checkout's and one built from the header without the
lock) is imported in place of the package's, then a random model of bench/random_model.py's 85M shape (float32, made
in memory: every large layer on the float32 C kernel, sharing its work on the pool's threads) decodes `--steps` steps
of one row on `--threads` pool threads. Prints each round's median ms per step, per build.

Run: .venv/bin/python bench/pool_lock_bench.py --kernel a.so --kernel b.so [--rounds 3] [--steps 200] [--threads 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPE = {"hidden_size": 768, "intermediate_size": 2048, "num_layers": 12, "num_heads": 12, "num_kv_heads": 12}


def decode_ms(kernel: Path, steps: int, threads: int) -> float:
    """Median ms of a one-row decode step with `kernel` as the `_matmul` extension."""
    name = "inference.engine.kernels._matmul"
    spec = importlib.util.spec_from_file_location(name, kernel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    sys.path.insert(0, str(REPO))
    import torch

    from inference.engine.execution.runner import ModelRunner
    from inference.engine.kernels import matmul as matmul_kernel
    from inference.engine.loaders.build import build_model
    from inference.engine.model.config import ModelConfig
    from inference.engine.model.layout import expected_hf_shapes

    torch.set_num_threads(1)
    matmul_kernel.set_threads(threads)
    config = ModelConfig(architecture="llama", vocab_size=512, head_dim=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                         max_position_embeddings=1024, tie_word_embeddings=False, **SHAPE)  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(s, generator=generator) * 0.02 for n, s in expected_hf_shapes(config).items()}
    runner = ModelRunner(build_model(config, tensors, context_window=512), max_concurrent=1,
                         context_window=512)  # fmt: skip
    slot = runner.allocate_slot()
    runner.prefill(slot, [1, 2, 3])
    times = []
    for step in range(steps):
        started = time.perf_counter()
        runner.decode([slot], [4 + step % 100])
        times.append(1000 * (time.perf_counter() - started))
        if runner.slot_length(slot) > 400:
            runner.truncate(slot, 3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", type=Path, action="append", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a child process's build
    args = parser.parse_args()
    if args.one:
        print(decode_ms(args.one, args.steps, args.threads))
        return
    for round_ in range(args.rounds):
        for kernel in args.kernel:
            command = [sys.executable, __file__, "--kernel", str(kernel), "--one", str(kernel)]
            command += ["--steps", str(args.steps), "--threads", str(args.threads)]
            ms = float(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
            print(f"round {round_ + 1}  {kernel}  {ms:.3f} ms/step", flush=True)


if __name__ == "__main__":
    main()
