"""Kernels for the remote examples: the worker loads them by name (`--kernels remote_kernels`),
and the client imports the same module to build its launches."""

import numpy as np

import actorgraph as ag


def _scale(out: np.ndarray, x: np.ndarray, k: int) -> None:
    np.multiply(x, k, out=out)


def _add(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    np.add(a, b, out=out)


SCALE = ag.Kernel("scale", cpu=_scale, outs=(0,), ins=(1,))
ADD = ag.Kernel("add", cpu=_add, outs=(0,), ins=(1, 2))

KERNELS = [SCALE, ADD]
