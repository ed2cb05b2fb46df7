"""Kernels the benchmark's workers load (`--kernels remote_kernels`)."""

import numpy as np

import actorgraph as ag


def _inc(out, a):
    np.add(a, 1, out=out)


INC = ag.Kernel("inc", cpu=_inc, outs=(0,), ins=(1,))
KERNELS = [INC]


def _gated(out, a):
    # Runs until the file named by ACTORGRAPH_BENCH_GATE exists (at most 60 s): another
    # client's slow kernel, for the isolation row, ended by the benchmark itself.
    import os
    import time

    path = os.environ["ACTORGRAPH_BENCH_GATE"]
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.001)
    np.copyto(out, a)


GATED = ag.Kernel("gated", cpu=_gated, outs=(0,), ins=(1,))
KERNELS.append(GATED)
