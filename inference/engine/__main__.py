"""The engine's command line: generate from a checkpoint with no server, or write the demo model.

    python -m inference.engine generate MODEL_PATH --prompt TEXT [--max-tokens N] [--temperature T] [--seed S]
                                        [--chat] [--json] [--device D] [--dtype T] [--quantize]
    python -m inference.engine make-demo-model DIR [--seed S]

`generate` goes through the same path a served request takes (HostedModel -> Scheduler -> runner and sampler), in
this process, so what it prints is what the server would stream for the same request.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from inference.engine.contract import messages as p
from inference.engine.contract.params import GenerationOptions, LoadOptions, SamplingParams
from inference.engine.demo_model import write_demo_model
from inference.engine.errors import LoadError
from inference.engine.hosted_model import HostedModel, RequestRefused
from inference.engine.step_results import Ended, Streamed


def generate(args: argparse.Namespace) -> dict:
    """Runs one request to completion; returns what `--json` prints."""
    options = LoadOptions(quantize=args.quantize, dtype=args.dtype or "")
    hosted = HostedModel.load(p.Load(request_id="cli", name="cli", path=args.model_path, options=options), args.device)
    tokenizer = hosted.model.tokenizer
    submit = p.Submit(
        request_id="cli",
        model="cli",
        messages=[{"role": "user", "content": args.prompt}] if args.chat else None,
        prompt_token_ids=None if args.chat else tokenizer.encode(args.prompt),
        sampling=SamplingParams(temperature=args.temperature, seed=args.seed),
        options=GenerationOptions(max_tokens=args.max_tokens),
    )
    hosted.check_bound(submit)
    seq = hosted.prepare(submit)
    hosted.scheduler.add(seq)
    pieces: list[str] = []
    first_token_at = None
    finish_reason = None
    while finish_reason is None:
        for result in hosted.scheduler.step():
            if isinstance(result, Streamed):
                first_token_at = first_token_at or time.perf_counter()
                pieces.append(result.text)
                if not args.json:
                    print(result.text, end="", flush=True)
            elif isinstance(result, Ended):
                finish_reason = result.finish_reason
    decode_s = time.perf_counter() - first_token_at
    decoded = len(seq.output_ids) - 1  # tokens produced by decode steps, after the prefill's first one
    if not args.json:
        print()
    return {
        "prompt_token_ids": seq.prompt_ids,
        "token_ids": seq.output_ids,
        "text": "".join(pieces),
        "finish_reason": finish_reason,
        "decode_tokens_per_s": decoded / decode_s if decoded > 0 and decode_s > 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.engine", description="Pantheon's torch engine.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate text from a Hugging Face directory or a GGUF file")
    gen.add_argument("model_path")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="<= 0 is greedy (the default)")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true", help="send the prompt as one user message via the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    gen.add_argument("--quantize", action="store_true", help="int8 weights for the linear layers")
    demo = commands.add_parser("make-demo-model", help="write the random-weight demo model (Hugging Face format)")
    demo.add_argument("directory")
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.command == "make-demo-model":
        print(write_demo_model(args.directory, seed=args.seed))
        return 0
    try:
        result = generate(args)
    except LoadError as exc:
        print(f"error: cannot load model: {exc}", file=sys.stderr)
        return 2
    except RequestRefused as exc:
        print(f"error: {exc.error.reason}: {exc.error.message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
