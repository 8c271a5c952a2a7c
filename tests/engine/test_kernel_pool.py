"""The C kernels' elastic pool (`_elastic_pool.h`) called from several threads at once: a load's warm-up multiplies
on its own thread while the worker's loop steps other models. Each call's product is the one it gets alone."""

import threading

import torch
from torch import nn

from inference.engine.kernels import matmul as matmul_kernel
from inference.engine.model.transformer import FloatLinear
from tests.engine.kernel_marks import needs_float_kernel

CALLS = 300


@needs_float_kernel
def test_products_on_two_threads_at_once_are_each_the_product_alone():
    torch.manual_seed(0)
    layers = [FloatLinear(nn.Linear(768, 1003, bias=False)) for _ in range(2)]
    inputs = [torch.randn(8, 768) for _ in range(2)]
    before = matmul_kernel.KERNEL.threads()
    matmul_kernel.set_threads(1)
    alone = [layer(x) for layer, x in zip(layers, inputs, strict=True)]
    wrong = [0, 0]

    def multiply(i: int) -> None:
        for _ in range(CALLS):
            wrong[i] += not torch.equal(layers[i](inputs[i]), alone[i])

    try:
        matmul_kernel.set_threads(3)
        threads = [threading.Thread(target=multiply, args=(i,), daemon=True) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads), "a call never returned"
        assert wrong == [0, 0]
    finally:
        matmul_kernel.set_threads(before)
