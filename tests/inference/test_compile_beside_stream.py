"""A load with `compile` beside a streaming model, on one real worker process: the load warms its decode step up on
the worker's load thread while the loop steps the other model, both through the C kernels' one pool of threads
(`_elastic_pool.h`), so the stream's greedy tokens are those it gets alone. Both models are a random Llama large
enough (over step_threads.SMALL_MODEL_PARAMETERS) for its matmuls to be shared out on the pool's threads."""

import asyncio
import json
import os
import shutil

import pytest
import pytest_asyncio
import torch
from safetensors.torch import save_file

from inference.engine.contract import messages as p
from inference.engine.execution.step_threads import SMALL_MODEL_PARAMETERS
from inference.runtime.supervisor import WorkerSupervisor
from tests.engine.kernel_marks import needs_float_kernel
from tests.inference.engine_calls import generate, load

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    needs_float_kernel,
]

SHAPE = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 1, "num_attention_heads": 16}
PROMPT = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421]
TOKENS = 120
POOL_THREADS = "3"  # the worker's threads for a large model: its kernel pool shares each matmul among three


@pytest.fixture(scope="module")
def random_llama(tmp_path_factory, stories_hf_dir):
    """stories260K's tokenizer and config with SHAPE's layers, random weights: ~17.8M parameters, float32."""
    path = tmp_path_factory.mktemp("random-llama")
    config = json.loads((stories_hf_dir / "config.json").read_text())
    config.update(SHAPE, num_key_value_heads=SHAPE["num_attention_heads"], head_dim=64, tie_word_embeddings=False)
    d, f, v = SHAPE["hidden_size"], SHAPE["intermediate_size"], config["vocab_size"]
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(SHAPE["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        shapes |= {layer + "input_layernorm.weight": (d,), layer + "post_attention_layernorm.weight": (d,)}
        shapes |= {layer + f"self_attn.{x}_proj.weight": (d, d) for x in "qkvo"}
        shapes |= {layer + f"mlp.{x}_proj.weight": (f, d) for x in ("gate", "up")}
        shapes[layer + "mlp.down_proj.weight"] = (d, f)
    assert sum(torch.Size(s).numel() for s in shapes.values()) > SMALL_MODEL_PARAMETERS
    generator = torch.Generator().manual_seed(0)
    save_file({name: torch.randn(shape, generator=generator) * 0.05 for name, shape in shapes.items()},
              str(path / "model.safetensors"))  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(stories_hf_dir / name, path / name)
    return path


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client(random_llama):
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = POOL_THREADS
    supervisor = WorkerSupervisor(devices=["cpu"])
    try:
        await supervisor.start()
    finally:
        if before is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = before
    await load(supervisor.client, "streamed", str(random_llama), device="cpu", max_concurrent=1, ctx_cap=256)
    yield supervisor.client
    await supervisor.stop()


async def stream_tokens(client) -> list[int]:
    generation = await generate(
        client, "streamed", prompt_token_ids=PROMPT, sampling={"temperature": 0.0}, max_tokens=TOKENS, ignore_eos=True
    )
    tokens = []
    async for event in generation:
        if isinstance(event, p.Tokens):
            tokens += event.token_ids
    return tokens


async def test_a_stream_beside_a_compiling_load_gets_the_tokens_it_gets_alone(client, random_llama):
    alone = await stream_tokens(client)
    assert len(alone) == TOKENS
    loading = asyncio.ensure_future(
        load(client, "compiled", str(random_llama), device="cpu", max_concurrent=1, ctx_cap=64, compile=True)
    )
    beside = []
    while not loading.done():  # streams one after another for as long as the load (and its warm-up) runs
        beside.append(await stream_tokens(client))
    loaded = loading.result()
    assert loaded.graphs.mode == "compiled" and loaded.graphs.buckets == [1]
    assert len(beside) >= 2  # one stream at least ran while the warm-up did
    assert all(tokens == alone for tokens in beside)
    await client.unload("compiled")
