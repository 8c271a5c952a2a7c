"""The compiled decode step (execution/compiled_step.py) on the real stories260K GGUF: greedy tokens identical to the
eager forward's, alone and in a padded batch of different prompts, and every failure reported as a fallback to eager.

Compiling costs seconds per bucket, so the compiled runner is built once, with the two buckets the tests use."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest
import torch

from inference.engine.contract import messages as p
from inference.engine.contract.params import LoadOptions, ServingLimits
from inference.engine.execution.compiled_step import DecodeGraphs, decode_buckets
from inference.engine.execution.runner import ModelRunner
from inference.engine.execution.step_threads import StepThreads
from inference.engine.hosted_model import HostedModel, compiles_decode
from inference.engine.loaders.loaded import LoadedModel
from inference.engine.loaders.loading import load_model
from inference.engine.model.transformer import FloatLinear
from tests.engine.kernel_marks import needs_float_kernel
from tests.greedy import greedy_batch

pytestmark = pytest.mark.usefixtures("one_thread")  # compiled steps run with the threads their graphs were made for

PROMPTS = ["Once upon a time", "The little dog saw a big", "Lily and Tom went to the park. They"]
STEPS = 32  # from prompts of 5-11 tokens: across the first and second block boundaries (16 positions each)


def greedy(model: LoadedModel, prompts: list[str], steps: int = STEPS) -> list[list[int]]:
    """Each prompt's greedy continuation, decoded together in one batch."""
    return decode_greedily(model, prompts, steps)[0]


def decode_greedily(model: LoadedModel, prompts: list[str], steps: int) -> tuple[list[list[int]], torch.Tensor]:
    """The greedy continuations and every decode step's logits [steps, B, V]."""
    return greedy_batch(model.runner, [model.tokenizer.encode(text) for text in prompts], steps)


def assert_same_decode(compiled: LoadedModel, eager: LoadedModel, prompts: list[str], steps: int = STEPS) -> None:
    """The same greedy tokens, from logits that differ only by rounding (the fused kernels sum in another order)."""
    compiled_ids, compiled_logits = decode_greedily(compiled, prompts, steps)
    eager_ids, eager_logits = decode_greedily(eager, prompts, steps)
    assert compiled_ids == eager_ids
    assert torch.allclose(compiled_logits, eager_logits, atol=1e-4, rtol=0), (
        (compiled_logits - eager_logits).abs().max()
    )


@pytest.fixture(scope="module")
def eager(stories_gguf_path) -> LoadedModel:
    return load_model(stories_gguf_path, max_concurrent=4, context_window=128)


@pytest.fixture(scope="module")
def compiled(stories_gguf_path) -> LoadedModel:
    """Warmed up bucket by bucket, as a worker's loop captures a CUDA model's between steps: no step uses the graphs
    until every bucket is warm."""
    model = load_model(stories_gguf_path, max_concurrent=4, context_window=128)
    graphs = model.runner.compile_decode(threads=1, buckets=[1, 4], now=False)  # a batch of 3 runs padded to 4
    assert graphs.pending == [4, 1]
    assert model.runner.warm_up_next() and graphs.pending == [1]
    slot = model.runner.allocate_slot()
    model.runner.prefill(slot, [1, 403])
    assert graphs.forward([407], model.runner.cache.view([slot], 1)) is None  # eager: a bucket is still cold
    model.runner.free_slot(slot)
    assert not model.runner.warm_up_next() and not model.runner.warm_up_next()
    assert (graphs.mode, graphs.buckets, graphs.fallback_reason) == ("compiled", [1, 4], None), graphs.fallback_reason
    assert graphs.warmup_ms > 0
    return model


def test_one_sequence_decodes_the_same_tokens_compiled(eager, compiled):
    assert_same_decode(compiled, eager, PROMPTS[:1])
    assert compiled.runner.graphs.mode == "compiled"  # no step fell back


def test_a_padded_batch_of_different_prompts_decodes_the_same_tokens_compiled(eager, compiled):
    assert_same_decode(compiled, eager, PROMPTS)
    expected = greedy(eager, PROMPTS)
    assert [greedy(compiled, [text])[0] for text in PROMPTS] == expected  # a row's tokens do not depend on the others
    assert compiled.runner.graphs.mode == "compiled"


def test_a_batch_without_a_bucket_of_its_own_runs_padded_in_the_next_one(eager, compiled):
    assert greedy(compiled, PROMPTS[:2], steps=4) == greedy(eager, PROMPTS[:2], steps=4)  # bucket 4
    assert compiled.runner.graphs.mode == "compiled"


def test_linear_layers_the_compiler_cannot_see_into_run_as_opaque_calls(stories_gguf_path):
    """int8 layers (fbgemm's packed weights, a torchbind object) stay outside the graph, called by index."""
    eager_int8, compiled_int8 = (load_model(stories_gguf_path, max_concurrent=1, context_window=64, quantize=True)
                                 for _ in range(2))  # fmt: skip
    graphs = compiled_int8.runner.compile_decode(threads=1)
    assert not any(linear.traced for linear in graphs.graph.linears[0])
    assert_same_decode(compiled_int8, eager_int8, PROMPTS[:1], steps=16)
    assert (graphs.mode, graphs.fallback_reason) == ("compiled", None)


@needs_float_kernel
def test_float32_layers_on_the_c_kernel_run_as_opaque_calls(tmp_path):
    """FloatLinear is never traced (the compiler cannot see into its kernel call): the graph calls it by index, so
    its forward never runs under compilation, and the compiled steps give the eager greedy tokens."""
    from gguf import GGMLQuantizationType

    from tests.engine.test_quantized_weights import _model, write_wide_gguf

    path = write_wide_gguf(tmp_path, GGMLQuantizationType.F32)
    runners = [ModelRunner(_model(path), max_concurrent=1, context_window=64) for _ in range(2)]
    assert isinstance(runners[1].model.layers[0].feed_forward.w13, FloatLinear)
    graphs = runners[1].compile_decode(threads=1)
    assert not any(linear.traced for linear in graphs.graph.linears[0])
    steps = []
    for runner in runners:
        slot = runner.allocate_slot()
        tokens, logits = [int(runner.prefill(slot, [1, 403, 407, 261, 378]).argmax())], []
        for _ in range(8):
            logits.append(runner.decode([slot], tokens))
            tokens = logits[-1].argmax(-1).tolist()
        steps.append(torch.stack(logits))
    assert torch.equal(steps[1].argmax(-1), steps[0].argmax(-1)) and graphs.mode == "compiled", graphs.fallback_reason
    # Rounding only: the compiled graph fuses the pointwise ops around the kernel calls and sums in another order.
    # Over 8 steps that reaches about 1e-5 of the largest logit on an AVX2 host (inductor's and the kernel's vector
    # widths); a wrong layer is off by whole units.
    assert (steps[1] - steps[0]).abs().max() <= 1e-4 * steps[0].abs().max()


def test_steps_with_other_threads_than_compiled_for_fall_back(stories_gguf_path):
    model = load_model(stories_gguf_path, max_concurrent=1, context_window=128)
    graphs = DecodeGraphs(
        model.runner.model, model.runner.cache, [1]
    )  # made for this test's one thread, as if warmed up
    graphs.pending.clear()
    model.runner.graphs = graphs
    torch.set_num_threads(2)
    slot = model.runner.allocate_slot()
    model.runner.prefill(slot, [1, 2])
    assert model.runner.decode([slot], [3]).shape == (1, model.config.vocab_size)
    assert graphs.fallback_reason == "a step ran with 2 threads; the graphs are for 1"


def test_a_failing_compiler_leaves_decode_eager_and_says_why(eager, stories_gguf_path, monkeypatch):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler here\nmore detail")

    monkeypatch.setattr(torch, "compile", broken_compile)
    model = load_model(stories_gguf_path, max_concurrent=2, context_window=128)
    graphs = model.runner.compile_decode(threads=1)
    assert (graphs.mode, graphs.buckets) == ("eager", [])
    assert graphs.fallback_reason == "warm-up failed: RuntimeError: no C++ compiler here"
    assert greedy(model, PROMPTS[:2], steps=8) == greedy(eager, PROMPTS[:2], steps=8)


def test_a_step_that_fails_is_redone_eagerly_and_decoding_stays_eager(eager, stories_gguf_path):
    model = load_model(stories_gguf_path, max_concurrent=2, context_window=128)
    graphs = DecodeGraphs(
        model.runner.model, model.runner.cache, [1, 2]
    )  # as if warmed up, with a graph that breaks at its first step

    def broken_graph(*args, **kwargs):
        raise RuntimeError("index out of bounds")

    graphs._compiled, graphs.backend.sealed, graphs.pending = broken_graph, True, []
    model.runner.graphs = graphs
    assert greedy(model, PROMPTS[:2], steps=8) == greedy(eager, PROMPTS[:2], steps=8)
    assert (graphs.mode, graphs.buckets) == ("eager", [])
    assert graphs.fallback_reason == "a step of 2 rows failed: RuntimeError: index out of bounds"


def test_a_load_reports_its_decode_graphs_and_their_fallback(stories_gguf_path, monkeypatch):
    def load(name: str, compile: bool) -> tuple[p.Loaded, p.ModelStatus]:
        req = p.Load(
            request_id=name,
            name=name,
            path=str(stories_gguf_path),
            options=LoadOptions(compile=compile, ctx_cap=64),
            limits=ServingLimits(max_concurrent=2),
        )
        hosted = HostedModel.load(req, "cpu", step_threads=lambda model: StepThreads(torch=1, kernels=1))
        hosted.barrier = SimpleNamespace(snapshot=lambda: None)  # the worker's, which this test has none of
        return hosted.loaded(req, 0.0), hosted.status()

    loaded, status = load("plain", compile=False)
    assert loaded.graphs == status.graphs == p.DecodeGraphs(mode="eager", buckets=[], warmup_ms=0.0)
    monkeypatch.setattr(torch, "compile", lambda *args, **kwargs: 1 / 0)
    loaded, status = load("broken", compile=True)
    assert loaded.graphs == status.graphs
    assert (loaded.graphs.mode, loaded.graphs.buckets) == ("eager", [])
    assert loaded.graphs.fallback_reason == "warm-up failed: ZeroDivisionError: division by zero"
    assert p.decode_from_worker(p.encode(loaded)) == loaded
    assert p.decode_from_worker(p.encode(p.Status(request_id="s", device="cpu", pid=1, memory_total=0,
                                                  memory_used=0, models=[status]))).models == [status]  # fmt: skip


def test_a_cuda_load_always_captures_its_decode_step_and_a_cpu_load_when_asked():
    """On CUDA an eager step is bound by kernel launches, several times slower than its captured graph
    (docs/performance.md, "GPU check"), so a CUDA load captures without being asked; CI has no GPU, and the GPU
    check's default-options load shows the capture happen."""
    assert compiles_decode(LoadOptions(), "cuda") and compiles_decode(LoadOptions(), "cuda:1")
    assert not compiles_decode(LoadOptions(), "cpu")
    assert compiles_decode(LoadOptions(compile=True), "cpu")


def test_a_compiled_model_is_freed_once_dropped(stories_gguf_path):
    """The compiled code outlives the model (dynamo keeps it on the forward's code object): it must not hold the
    weights or the KV pool, or an unload would free nothing."""
    model = load_model(stories_gguf_path, max_concurrent=1, context_window=64)
    assert model.runner.compile_decode(threads=1).mode == "compiled"
    slot = model.runner.allocate_slot()
    model.runner.prefill(slot, [1, 2, 3])
    model.runner.decode([slot], [4])
    weights, pool = weakref.ref(model.runner.model), weakref.ref(model.runner.cache.keys[0])
    del model
    gc.collect()
    assert weights() is None and pool() is None


def test_buckets_are_powers_of_two_up_to_the_slot_count():
    assert decode_buckets(1) == [1]
    assert decode_buckets(3) == [1, 2, 3]
    assert decode_buckets(12) == [1, 2, 4, 8, 12]
    assert decode_buckets(32) == [1, 2, 4, 8, 16, 32]
