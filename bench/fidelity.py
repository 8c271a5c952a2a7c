"""Fidelity of the engine's attention paths: greedy ids and logits of attention "flex" against "gather" on the
device, each with its decode graphs against its eager decode, and, for a small random Llama written as a Hugging Face
checkpoint, both against the engine in float32 on the CPU and against transformers' LlamaForCausalLM.

Every run decodes the same prompts: a short one, a long one prefilled in chunks (chunked prefill), one that starts
from the long one's cached blocks and then parts from it (a prefix hit, token-fine), and a two-token one, all decoded
as one batch. A comparison prints how long two greedy runs pick the same tokens, how close their logits are while
their inputs are the same, and where they part, how near a tie the reference was (a small margin: rounding), then the
same as one JSON line.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
from random_model import _random_tensors
from real_model import RandomModel
from safetensors.torch import save_file

from inference.engine.execution.runner import ModelRunner
from inference.engine.loaders.loading import load_model

GREEDY_TOKENS = 32
SMALL_VOCAB = 512  # stories260K's, as random_model.py gives its model


@dataclass(frozen=True, slots=True)
class Prompt:
    ids: list[int]
    chunk: int | None = None  # prefilled in chunks of this many tokens
    reuse: bool = False  # starts from the cached blocks an earlier prompt of the run left


def fidelity_prompts(vocab: int, long: int, chunk: int, seed: int = 0) -> list[Prompt]:
    """The four prompts every run decodes; the third shares the first 3/4 of the long one (not on a block edge)."""
    generator = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=generator).tolist()

    long_ids = ids(long)
    shared = (long * 3 // 4) | 1  # odd: never a whole number of blocks
    return [
        Prompt(ids(6)),
        Prompt(long_ids, chunk=chunk),
        Prompt(long_ids[:shared] + ids(8), reuse=True),
        Prompt(ids(2)),
    ]


def positions_needed(prompts: list[Prompt]) -> int:
    return max(len(p.ids) for p in prompts) + GREEDY_TOKENS


@torch.inference_mode()
def engine_greedy(runner: ModelRunner, prompts: list[Prompt]) -> tuple[torch.Tensor, list[int]]:
    """The float32 logits [B, GREEDY_TOKENS, V] each greedy token of each prompt was picked from, the prompts
    prefilled one after the other (chunked, or from a prefix, as each says) and decoded as one batch; and the tokens
    each prompt reused from the cache."""
    slots, first, reused = [], [], []
    try:
        for prompt in prompts:
            slots.append(runner.allocate_slot())
            reused.append(runner.reuse_prefix(slots[-1], prompt.ids) if prompt.reuse else 0)
            chunk = prompt.chunk or len(prompt.ids)
            for start in range(reused[-1], len(prompt.ids), chunk):
                logits = runner.prefill(slots[-1], prompt.ids[start : start + chunk])
            first.append(logits)
        logits = [torch.stack(first)]
        for _ in range(GREEDY_TOKENS - 1):
            logits.append(runner.decode(slots, logits[-1].argmax(-1).tolist()).clone())
    finally:
        for slot in slots:
            runner.free_slot(slot)
    return torch.stack(logits, dim=1), reused


def with_graphs(runner: ModelRunner, prompts: list[Prompt]) -> torch.Tensor:
    """engine_greedy with the runner's decode steps captured (CUDA) or compiled (CPU) for the prompts' batch; the
    runner decodes eagerly again afterwards."""
    graphs = runner.compile_decode(buckets=[len(prompts)])
    try:
        if graphs.mode == "eager":
            raise RuntimeError(f"the decode graphs fell back to eager: {graphs.fallback_reason}")
        return engine_greedy(runner, prompts)[0]
    finally:
        runner.graphs = None


def compare(label: str, where: dict, got: torch.Tensor, expected: torch.Tensor, reference: str) -> None:
    """Prints the agreement of two greedy runs' logits [B, n, V] (or lists of [n, V]), as text and as JSON."""
    agree, diffs, parted = [], [], []
    for i, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        mine, theirs = mine.float(), theirs.float().to(mine.device)
        n = theirs.shape[0]
        differ = (mine.argmax(-1) != theirs.argmax(-1)).nonzero()
        same = int(differ[0]) if len(differ) else n
        shared = slice(0, min(same + 1, n))  # the parting token's logits still came from the same inputs
        agree.append(same)
        diffs.append(float((mine[shared] - theirs[shared]).abs().max()))
        if same < n:
            top = theirs[same].topk(2).values
            parted.append({"prompt": i, "token": same, "margin": float(top[0] - top[1])})
    tokens = expected[0].shape[0]
    text = f"{label} ({', '.join(str(v) for v in where.values())}): "
    text += f"{' '.join(f'{a}/{tokens}' for a in agree)} tokens agree; logits max |diff| {max(diffs):.2e} until then"
    for p in parted:
        text += f"; prompt {p['prompt']} parts at token {p['token']}, where {reference}'s top two are "
        text += f"{p['margin']:.3g} apart"
    print(text)
    line = {"kind": "fidelity", "compare": label, **where, "agree": agree, "tokens": tokens}
    print(json.dumps(line | {"max_abs_diff": max(diffs), "parted": parted}))


def shape_fidelity(built: RandomModel, long: int, chunk: int, graphs: bool) -> None:
    """flex against gather on a real shape's random model, and each one's decode graphs against its eager decode;
    the long prompt has `long` tokens, prefilled `chunk` at a time."""
    device = built.model.norm.weight.device
    prompts = fidelity_prompts(built.config.vocab_size, long=long, chunk=chunk)
    runners = {
        attention: ModelRunner(
            built.model, max_concurrent=len(prompts), context_window=positions_needed(prompts), attention=attention
        )
        for attention in ("gather", "flex")
    }
    where = {"model": built.name, "device": device.type, "dtype": str(built.dtype).removeprefix("torch.")}
    runs = {attention: engine_greedy(runner, prompts) for attention, runner in runners.items()}
    print(f"prefix hit: prompt 2 reused {runs['flex'][1][2]} of {len(prompts[2].ids)} tokens (flex)")
    compare("flex vs gather", where, runs["flex"][0], runs["gather"][0], "gather")
    if graphs:
        for attention, runner in runners.items():
            graphed = with_graphs(runner, prompts)
            compare(f"{attention} graphs vs eager", where, graphed, runs[attention][0], "eager")


def write_checkpoint(out_dir: Path, shape: dict[str, int]) -> Path:
    """random_model.py's random Llama in `shape`, as a Hugging Face directory that both the engine and transformers
    load; the tokenizer only has to exist and cover the vocabulary (the stories260K files random_model.py copies its
    tokenizer from are not on a bare GPU machine)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": SMALL_VOCAB,
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
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"t{i}": i for i in range(3, SMALL_VOCAB)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    backend.save(str(out_dir / "tokenizer.json"))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(specials))
    return out_dir


@torch.inference_mode()
def transformers_greedy(model, prompt: list[int]) -> torch.Tensor:
    """transformers' float32 logits [GREEDY_TOKENS, V] along its own greedy continuation, the whole sequence
    recomputed at each step: no cache of its own to get wrong."""
    ids = torch.tensor([prompt], device=model.device)
    logits = []
    for _ in range(GREEDY_TOKENS):
        logits.append(model(ids).logits[0, -1].float())
        ids = torch.cat([ids, logits[-1].argmax().view(1, 1)], dim=1)
    return torch.stack(logits)


def transformers_runs(path: Path, prompts: list[Prompt], device: torch.device, dtype: torch.dtype) -> dict:
    """transformers' greedy runs of the prompts in `dtype` and, away from float32, in float32 too: the yardstick of
    what rounding alone does. Empty when transformers is not installed."""
    if importlib.util.find_spec("transformers") is None:
        print("transformers is not installed: its comparisons are skipped")
        return {}
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # one stream of results, no bars
    runs = {}
    for run_dtype in dict.fromkeys((dtype, torch.float32)):
        reference = LlamaForCausalLM.from_pretrained(path).to(device=device, dtype=run_dtype).eval()
        runs[f"transformers {str(run_dtype).removeprefix('torch.')}"] = [
            transformers_greedy(reference, p.ids) for p in prompts
        ]
    return runs


def small_fidelity(path: Path, device: torch.device, dtype: torch.dtype, graphs: bool) -> None:
    """The small checkpoint at `path` through both attention paths on the device (and their graphs), against each
    other, the engine in float32 on the CPU, and transformers."""
    prompts = fidelity_prompts(SMALL_VOCAB, long=41, chunk=16)
    window = positions_needed(prompts)
    loaded = load_model(path, device=device, dtype=dtype, max_concurrent=len(prompts), context_window=window)
    runners = {"gather": loaded.runner}
    model = loaded.runner.model
    runners["flex"] = ModelRunner(model, max_concurrent=len(prompts), context_window=window, attention="flex")
    runs = {attention: engine_greedy(runner, prompts)[0] for attention, runner in runners.items()}
    cpu = load_model(path, device="cpu", dtype=torch.float32, max_concurrent=len(prompts), context_window=window)
    references = {"engine cpu float32": engine_greedy(cpu.runner, prompts)[0]}
    references |= transformers_runs(path, prompts, device, dtype)
    where = {"model": "small llama", "device": device.type, "dtype": str(dtype).removeprefix("torch.")}
    compare("flex vs gather", where, runs["flex"], runs["gather"], "gather")
    if graphs:
        for attention, runner in runners.items():
            graphed = with_graphs(runner, prompts)
            compare(f"{attention} graphs vs eager", where, graphed, runs[attention], "eager")
    for name, reference in references.items():
        for attention, run in runs.items():
            compare(f"{attention} vs {name}", where, run, reference, name)
    low = f"transformers {where['dtype']}"
    if low != "transformers float32" and low in references:  # its own rounding against float32: the yardstick
        exact = references["transformers float32"]
        compare(f"{low} vs transformers float32", where, references[low], exact, "transformers float32")
