"""Kernels with both a CPU body and CUDA source, and a GPU probe, for the CUDA tests."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import actorgraph as ag

XOR_SRC = r"""
extern "C" __global__ void xor_k(int *out, const int *a, const int *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] ^ b[i];
}
"""

INC_SRC = r"""
extern "C" __global__ void inc_k(int *buf, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) buf[i] += 1;
}
"""


def _xor(out: np.ndarray, a: np.ndarray, b: np.ndarray, n: int) -> None:
    np.bitwise_xor(a[:n], b[:n], out=out[:n])


def _inc(buf: np.ndarray, n: int) -> None:
    buf[:n] += 1


XOR = ag.Kernel("xor_k", cpu=_xor, cuda=XOR_SRC, outs=(0,), ins=(1, 2))
INC = ag.Kernel("inc_k", cpu=_inc, cuda=INC_SRC, outs=(0,), ins=(0,))
N = ag.Var("n", 1, 1 << 20)


def xor(out: ag.Buffer, a: ag.Buffer, b: ag.Buffer) -> ag.Launch:
    n = out.size
    return ag.Launch(
        XOR, [out, a, b], vars=[N], fixedvars={N: n}, global_size=ag.cdiv(n, 64), local_size=64
    )


def inc(buf: ag.Buffer) -> ag.Launch:
    n = buf.size
    return ag.Launch(
        INC, [buf], vars=[N], fixedvars={N: n}, global_size=ag.cdiv(n, 64), local_size=64
    )


@functools.cache
def gpu_count() -> int:
    """How many GPUs the real driver sees here (0 without a GPU or driver)."""
    try:
        from actorgraph.devices.cuda._real import real_driver

        return real_driver().device_count()
    except Exception:
        return 0


def needs_gpus(count: int = 1) -> pytest.MarkDecorator:
    return pytest.mark.skipif(gpu_count() < count, reason=f"needs {count} real CUDA GPU(s)")
