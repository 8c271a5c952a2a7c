"""What the card can do, measured on it at the start of a run, beside its maker's figure where the name is known: the
memory bandwidth that bounds a decode step (a large device-to-device copy) and the matmul rate that bounds a prefill
(a large square matmul in the run's dtype). The measured figures are the rows' bounds; the nominal ones say how far
the card itself is from its sheet."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from functools import partial

import torch

# The makers' figures, by a pattern of torch's device name: HBM bandwidth in TB/s and dense bfloat16 TFLOP/s. An
# "H100 80GB HBM3" is the SXM part; an A100's 40 GB PCIe part (1.56 TB/s) is left out on purpose: unmatched, a card
# prints no nominal figure rather than a wrong one.
NOMINAL = (
    (r"H200", 4.8, 989.0),
    (r"H100.*PCIe", 2.0, 756.0),
    (r"H100.*(HBM3|SXM)", 3.35, 989.0),
    (r"A100.*SXM4?-80GB", 2.04, 312.0),
    (r"A100 80GB PCIe", 1.94, 312.0),
    (r"L40S", 0.864, 362.0),
    (r"\bL4$", 0.3, 121.0),
)
ROUNDS = 5  # the best of these is the figure: noise only ever slows a round down
REPEATS = 10  # operations timed together in a round


@dataclass(frozen=True, slots=True)
class Card:
    """Bandwidth in bytes/s and matmul rate in FLOP/s, measured and (None where unknown) nominal."""

    name: str
    bandwidth: float
    matmul: float
    nominal_bandwidth: float | None
    nominal_matmul: float | None

    def summary(self) -> dict:
        return {
            "kind": "card",
            "card": self.name,
            "bandwidth": self.bandwidth,
            "matmul": self.matmul,
            "nominal_bandwidth": self.nominal_bandwidth,
            "nominal_matmul": self.nominal_matmul,
        }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def nominal(name: str) -> tuple[float | None, float | None]:
    """The maker's (bytes/s, FLOP/s) for a device name, or (None, None)."""
    for pattern, terabytes, teraflops in NOMINAL:
        if re.search(pattern, name):
            return terabytes * 1e12, teraflops * 1e12
    return None, None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(device: torch.device, operation) -> float:
    """The fastest of ROUNDS rounds' seconds per call of `operation`, after one untimed call."""
    operation()
    best = float("inf")
    for _ in range(ROUNDS):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(REPEATS):
            operation()
        synchronize(device)
        best = min(best, (time.perf_counter() - start) / REPEATS)
    return best


def measure_card(device: torch.device, dtype: torch.dtype, copy_bytes: int, matmul_size: int) -> Card:
    """Copies `copy_bytes` from one buffer to another (read and write: twice that many bytes move) and multiplies
    two `matmul_size`-square matrices in `dtype` (2 n^3 FLOPs)."""
    source = torch.empty(copy_bytes, dtype=torch.uint8, device=device).fill_(1)
    bandwidth = 2 * copy_bytes / best_seconds(device, partial(torch.empty_like(source).copy_, source))
    del source
    a = torch.randn(matmul_size, matmul_size, device=device, dtype=dtype)
    b = torch.randn(matmul_size, matmul_size, device=device, dtype=dtype)
    out = torch.empty_like(a)
    matmul = 2 * matmul_size**3 / best_seconds(device, partial(torch.matmul, a, b, out=out))
    name = device_name(device)
    return Card(name, bandwidth, matmul, *nominal(name))


def describe(card: Card) -> str:
    def against(nominal_value: float | None, measured: float, unit: float) -> str:
        if nominal_value is None:
            return "nominal: not known for this card"
        return f"nominal {nominal_value / unit:.3g} (measured/nominal {measured / nominal_value:.2f})"

    return (
        f"{card.name}: memory bandwidth {card.bandwidth / 1e12:.3g} TB/s measured, "
        f"{against(card.nominal_bandwidth, card.bandwidth, 1e12)}; matmul {card.matmul / 1e12:.3g} TFLOP/s measured, "
        f"{against(card.nominal_matmul, card.matmul, 1e12)}"
    )
