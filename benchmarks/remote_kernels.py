"""Kernels the benchmark's workers load (`--kernels remote_kernels`)."""

import numpy as np

import actorgraph as ag


def _inc(out, a):
    np.add(a, 1, out=out)


INC = ag.Kernel("inc", cpu=_inc, outs=(0,), ins=(1,))
KERNELS = [INC]
