"""bench/gpu_check.py's CPU smoke run (`--device cpu --shape tiny`), read as its user reads it on a lent GPU: every
row measured, each against a bound that counts what the step must read (the streamed weights and every row's live KV)
or compute, and every fidelity comparison agreeing, token for token."""

import json
import subprocess
import sys

import pytest

from bench.card import nominal
from tests.conftest import REPO_ROOT

# The tiny scale's rows: its two models, both attention paths, the done-when row (batch 4 at 64 tokens), prefill
# (2 prompts of 64 tokens) and the grid (batch 1 and 4 at 32 and 128 tokens).
MODELS = ("tiny-llama", "tiny-qwen3")
ATTENTION = ("gather", "flex")
EXPECTED_ROWS = {
    (kind, model, attention, batch, context)
    for model in MODELS
    for attention in ATTENTION
    for kind, batch, context in [
        ("decode", 4, 64),
        ("prefill", 2, 64),
        *(("decode", b, c) for b in (1, 4) for c in (32, 128)),
    ]
}
FLOAT32_BYTES = 4


@pytest.fixture(scope="module")
def smoke() -> list[dict]:
    """The run's JSON lines, after checking it ran through without a failed part."""
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--device", "cpu", "--shape", "tiny"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "Traceback" not in done.stdout, done.stdout
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def of_kind(lines: list[dict], *kinds: str) -> list[dict]:
    return [line for line in lines if line["kind"] in kinds]


def test_every_row_is_measured_with_a_bound_and_a_ratio(smoke):
    rows = of_kind(smoke, "decode", "prefill")
    assert {(r["kind"], r["model"], r["attention"], r["batch"], r["context"]) for r in rows} == EXPECTED_ROWS
    for row in rows:
        assert "skipped" not in row, row
        assert row["tok_s"] > 0 and row["bound_tok_s"] > 0, row
        assert row["ratio"] == pytest.approx(row["tok_s"] / row["bound_tok_s"])
        assert row["nominal_ratio"] is None  # no maker's figure for a CPU: none is made up


def test_a_decode_bound_reads_the_weights_and_every_rows_live_kv(smoke):
    """Recomputed from what the run prints: the model's shape, the card's measured bandwidth."""
    (card,) = of_kind(smoke, "card")
    models = {line["model"]: line for line in of_kind(smoke, "model")}
    for row in of_kind(smoke, "decode"):
        model = models[row["model"]]
        batch, context = row["batch"], row["context"]
        # the context, and the tokens the timed steps add (each step reads its own new token too)
        assert batch * context < row["kv_tokens"] < batch * (context + 16), row
        per_token = model["layers"] * 2 * model["kv_heads"] * model["head_dim"] * FLOAT32_BYTES
        step_bytes = model["streamed_bytes"] + row["kv_tokens"] * per_token
        assert row["bound_tok_s"] == pytest.approx(batch * card["bandwidth"] / step_bytes), row
    # a step streams every weight but the embedding table, of which it reads only its rows: on a CPU even a tied
    # table, since the output head keeps a copy in its own layout (on CUDA the head reads the table itself)
    for m in models.values():
        assert m["streamed_bytes"] == m["weight_bytes"] - m["vocab"] * m["hidden"] * FLOAT32_BYTES, m


def test_a_prefill_bound_counts_every_token_through_every_layer(smoke):
    (card,) = of_kind(smoke, "card")
    models = {line["model"]: line for line in of_kind(smoke, "model")}
    for row in of_kind(smoke, "prefill"):
        m, tokens = models[row["model"]], row["batch"] * row["context"]
        q, kv = m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
        linear = m["hidden"] * (q + 2 * kv) + q * m["hidden"] + 3 * m["hidden"] * m["ffn"]
        assert row["flops"] > 2 * tokens * m["layers"] * linear, row  # attention and the head come on top
        assert row["bound_tok_s"] == pytest.approx(card["matmul"] * tokens / row["flops"])


def test_both_attention_paths_agree_with_each_other_the_cpu_and_transformers(smoke):
    lines = of_kind(smoke, "fidelity")
    compared = {(line["model"], line["compare"]) for line in lines}
    small = [
        f"{attention} vs {reference}"
        for attention in ATTENTION
        for reference in ("engine cpu float32", "transformers float32")
    ]
    assert {("small llama", name) for name in ["flex vs gather", *small]} <= compared
    assert {(model, "flex vs gather") for model in MODELS} <= compared
    for line in lines:
        assert line["agree"] == [line["tokens"]] * 4, line  # four prompts, every greedy token the same
        assert line["max_abs_diff"] < 1e-4, line


@pytest.mark.parametrize(
    ("name", "terabytes"),
    [
        ("NVIDIA H100 80GB HBM3", 3.35),  # the SXM part
        ("NVIDIA H100 PCIe", 2.0),
        ("NVIDIA H200", 4.8),
        ("NVIDIA A100-SXM4-80GB", 2.04),
        ("NVIDIA A100 80GB PCIe", 1.94),
        ("NVIDIA L40S", 0.864),
        ("NVIDIA L4", 0.3),
        ("NVIDIA A100-PCIE-40GB", None),  # not in the table: no figure rather than a neighbour's
        ("NVIDIA H100 NVL", None),
    ],
)
def test_a_cards_nominal_bandwidth_is_found_by_its_name(name, terabytes):
    bandwidth, _ = nominal(name)
    assert bandwidth == (None if terabytes is None else pytest.approx(terabytes * 1e12))
