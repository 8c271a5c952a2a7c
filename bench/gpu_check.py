"""A one-shot check of the engine on a CUDA machine, made for a lent GPU with minutes of budget and no network: does
the engine's bfloat16 forward agree with transformers', and how fast does it decode at batch 1, 8 and 32, eagerly
and with each decode step captured as a CUDA graph by the engine's own `ModelRunner.compile_decode` (the load option
`compile`; execution/compiled_step.py), whose greedy tokens are first held to the eager decode's.

The model is bench/random_model.py's random Llama (its shape and weights) with a word-level tokenizer written here:
the stories260K files that script copies its tokenizer from are not on a bare machine, and the check feeds token ids.
Run it through bench/gpu_check.sh, which finds a Python whose torch sees the GPU. `--device cpu` (float32) runs every
code path on a CPU (there compile_decode compiles with inductor instead of capturing), and `--shape tiny` makes that
quick.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import tokenizers
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from random_model import SHAPES as BENCH_SHAPES  # noqa: E402
from random_model import _random_tensors  # noqa: E402

from inference.engine.execution.runner import ModelRunner  # noqa: E402
from inference.engine.loaders.loading import load_model  # noqa: E402

VOCAB_SIZE = 512  # stories260K's, as random_model.py gives its model
SHAPES = {
    "85m": BENCH_SHAPES["random85m"],
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256},
}
CONTEXT_WINDOW = 128  # every prompt and continuation here fits; a captured step attends over all of it
PARITY_PROMPTS = ([1, 5, 17, 200, 3, 99], [1, *range(10, 50)], [1, 42])
GREEDY_TOKENS = 32
BATCHES = (1, 8, 32)
PROMPT_TOKENS = 16
DECODE_STEPS = 64


def write_checkpoint(out_dir: Path, shape: dict[str, int]) -> Path:
    """random_model.py's random Llama in `shape`, as a Hugging Face directory that both the engine and transformers
    load; the tokenizer only has to exist and cover the vocabulary."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        **shape,
        "num_key_value_heads": shape["num_attention_heads"],
        "head_dim": shape["hidden_size"] // shape["num_attention_heads"],
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    save_file(_random_tensors(config, seed=0), str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"t{i}": i for i in range(3, VOCAB_SIZE)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    backend.save(str(out_dir / "tokenizer.json"))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(specials))
    return out_dir


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


@torch.inference_mode()
def engine_greedy(runner: ModelRunner, prompts: list[list[int]], decode_step, new_tokens: int) -> torch.Tensor:
    """The float32 logits [B, new_tokens, V] each greedy token of each prompt was picked from, the prompts prefilled
    and decoded as one batch by `decode_step` (ModelRunner.decode)."""
    slots = [runner.allocate_slot() for _ in prompts]
    try:
        logits = [runner.prefill_batch(slots, prompts)]
        for _ in range(new_tokens - 1):
            logits.append(decode_step(slots, logits[-1].argmax(-1).tolist()).clone())
    finally:
        for slot in slots:
            runner.free_slot(slot)
    return torch.stack(logits, dim=1)


@torch.inference_mode()
def transformers_greedy(model, prompt: list[int], new_tokens: int) -> torch.Tensor:
    """transformers' float32 logits [new_tokens, V] along its own greedy continuation, the whole sequence recomputed
    at each step: no cache of its own to get wrong."""
    ids = torch.tensor([prompt], device=model.device)
    logits = []
    for _ in range(new_tokens):
        logits.append(model(ids).logits[0, -1].float())
        ids = torch.cat([ids, logits[-1].argmax().view(1, 1)], dim=1)
    return torch.stack(logits)


def agreement(got: torch.Tensor, expected: torch.Tensor) -> str:
    """How long two greedy runs (their logits [n, V]) pick the same tokens, how close their logits are while their
    inputs are the same, and where they part, how near a tie the expected run was (a small margin: rounding)."""
    n = expected.shape[0]
    parted = (got.argmax(-1) != expected.argmax(-1)).nonzero()
    same = int(parted[0]) if len(parted) else n
    shared = slice(0, min(same + 1, n))
    text = f"{same}/{n} tokens agree; logits max |diff| {(got[shared] - expected[shared]).abs().max():.2e} until then"
    if same < n:
        top = expected[same].topk(2).values
        text += f"; at token {same} the reference's top two logits are {top[0] - top[1]:.3g} apart"
    return text


def check_parity(path: Path, runner: ModelRunner, dtype: torch.dtype) -> None:
    """Last-position logits of PARITY_PROMPTS, then GREEDY_TOKENS greedy tokens, against transformers in the same
    dtype; away from float32, both are also compared with transformers in float32, which says whether the engine's
    rounding error is larger than transformers' own."""
    if importlib.util.find_spec("transformers") is None:
        print("transformers is not installed: parity skipped")
        return
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # one stream of results, no bars
    reference = LlamaForCausalLM.from_pretrained(path).to(device=runner.device, dtype=dtype).eval()
    float32_reference = None
    if dtype != torch.float32:
        float32_reference = LlamaForCausalLM.from_pretrained(path).to(device=runner.device).eval()
    prompts = [list(p) for p in PARITY_PROMPTS]
    engine = engine_greedy(runner, prompts, runner.decode, GREEDY_TOKENS)  # [B, n, V]
    for i, prompt in enumerate(prompts):
        expected = transformers_greedy(reference, prompt, GREEDY_TOKENS)
        diff = (engine[i, 0] - expected[0]).abs().max().item()
        line = (
            f"prompt {i} ({len(prompt)} tokens): last-position logits max |diff| {diff:.2e}, "
            f"relative {diff / expected[0].abs().max().item():.2e}"
        )
        if float32_reference is not None:
            exact = transformers_greedy(float32_reference, prompt, 1)[0]
            line += (
                f"; against transformers float32: engine {(engine[i, 0] - exact).abs().max():.2e}, "
                f"transformers {str(dtype).removeprefix('torch.')} {(expected[0] - exact).abs().max():.2e}"
            )
        engine_next, expected_next = int(engine[i, 0].argmax()), int(expected[0].argmax())
        verdict = "same" if engine_next == expected_next else "DIFFERENT"
        print(f"{line}; next token {engine_next} / {expected_next}: {verdict}")
        print(f"  greedy {GREEDY_TOKENS} tokens: {agreement(engine[i], expected)}")


@torch.inference_mode()
def seconds_per_step(runner: ModelRunner, batch: int, decode_step) -> float:
    """Seconds per greedy decode step of `batch` random PROMPT_TOKENS-token prompts, over DECODE_STEPS steps after a
    first one left untimed (for a graph it holds the capture)."""
    generator = torch.Generator().manual_seed(batch)
    prompts = torch.randint(3, runner.vocab_size, (batch, PROMPT_TOKENS), generator=generator).tolist()
    slots = [runner.allocate_slot() for _ in prompts]
    try:
        tokens = runner.prefill_batch(slots, prompts).argmax(-1).tolist()
        tokens = decode_step(slots, tokens).argmax(-1).tolist()
        synchronize(runner.device)
        start = time.perf_counter()
        for _ in range(DECODE_STEPS):
            tokens = decode_step(slots, tokens).argmax(-1).tolist()
        synchronize(runner.device)
        return (time.perf_counter() - start) / DECODE_STEPS
    finally:
        for slot in slots:
            runner.free_slot(slot)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


TABLE_HEADER = f"{'decode':<8} {'batch':>5} {'tok/s':>9} {'ms/step':>8} {'vs eager':>9} {'warm-up ms':>11}"


def eager_throughput(runner: ModelRunner) -> dict[int, float]:
    """Seconds per eager decode step at each of BATCHES, printed as rows of TABLE_HEADER."""
    print(TABLE_HEADER)
    per_step = {}
    for batch in BATCHES:
        per_step[batch] = seconds_per_step(runner, batch, runner.decode)
        print(f"{'eager':<8} {batch:>5} {batch / per_step[batch]:>9.1f} {1000 * per_step[batch]:>8.2f}")
    return per_step


def check_graphs(runner: ModelRunner, eager_per_step: dict[int, float]) -> None:
    """The engine's own decode graphs: their warm-up, their greedy tokens on the parity prompts against the eager
    decode's, then their throughput rows; the runner decodes eagerly again afterwards."""
    prompts = [list(p) for p in PARITY_PROMPTS]
    eager = engine_greedy(runner, prompts, runner.decode, GREEDY_TOKENS)
    graphs = runner.compile_decode()
    per_bucket = ", ".join(f"{bucket}: {ms:.0f}" for bucket, ms in graphs.bucket_ms.items())
    print(f"mode {graphs.mode}, buckets {graphs.buckets}, warm-up {graphs.warmup_ms:.0f} ms (per bucket: {per_bucket})")
    try:
        if graphs.mode == "eager":
            print(f"fell back to eager: {graphs.fallback_reason}")
            return
        graphed = engine_greedy(runner, prompts, runner.decode, GREEDY_TOKENS)
        print(f"greedy {GREEDY_TOKENS} tokens of the parity prompts as one batch, against the eager decode:")
        for i in range(len(prompts)):
            print(f"prompt {i}: {agreement(graphed[i], eager[i])}")
        print(TABLE_HEADER)
        for batch in BATCHES:
            step_s = seconds_per_step(runner, batch, runner.decode)
            label = "graph" if graphs.mode == "cuda_graphs" else graphs.mode
            capture = f"{graphs.bucket_ms[batch]:>11.0f}" if batch in graphs.bucket_ms else ""
            row = (
                f"{label:<8} {batch:>5} {batch / step_s:>9.1f} {1000 * step_s:>8.2f} "
                f"{eager_per_step[batch] / step_s:>8.2f}x {capture}"
            )
            print(row.rstrip())
        if graphs.mode == "eager":
            print(f"fell back to eager while stepping: {graphs.fallback_reason}")
    finally:
        runner.graphs = None


def check_default_load(path: Path, device: torch.device) -> None:
    """The worker's load with every option left at its default (HostedModel.load, as `manage.py load_model` with no
    flags): on CUDA its decode step is captured all the same, and this is the report /admin/models shows. Imported
    here: the worker's side needs msgspec and llguidance, which a bare GPU image may lack, and the rest does not."""
    from inference.engine.contract import messages as p
    from inference.engine.contract.params import LoadOptions, ServingLimits
    from inference.engine.hosted_model import HostedModel

    req = p.Load(
        request_id="gpu-check",
        name="gpu-check",
        path=str(path),
        options=LoadOptions(),
        limits=ServingLimits(max_concurrent=max(BATCHES)),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu runs every code path in float32, no GPU needed"
    )
    parser.add_argument("--shape", choices=SHAPES, default="85m", help="tiny: a 2-layer model, quick on a CPU")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    print("== environment")
    print_environment(device)
    with tempfile.TemporaryDirectory(prefix="pantheon-gpu-check-") as tmp:
        start = time.perf_counter()
        path = write_checkpoint(Path(tmp), SHAPES[args.shape])
        loaded = load_model(
            path, device=device, dtype=dtype, max_concurrent=max(BATCHES), context_window=CONTEXT_WINDOW
        )
        print(
            f"model: random Llama {args.shape} ({loaded.weight_bytes / 1e6:.0f} MB of {loaded.dtype} weights), "
            f"written and loaded in {time.perf_counter() - start:.1f} s"
        )
        section(f"parity with transformers ({loaded.dtype}, {device})", check_parity, path, loaded.runner, loaded.dtype)
        section("a load with the default options (HostedModel.load)", check_default_load, path, device)
    runner = loaded.runner
    title = f"decode throughput, eager (greedy, {PROMPT_TOKENS}-token prompts, {DECODE_STEPS} steps timed)"
    eager_per_step = section(title, eager_throughput, runner)
    if eager_per_step is not None:
        title = "decode with the engine's graphs (ModelRunner.compile_decode: CUDA graphs on cuda, inductor on cpu)"
        section(title, check_graphs, runner, eager_per_step)
    if device.type == "cuda":
        print(f"peak CUDA memory allocated: {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
