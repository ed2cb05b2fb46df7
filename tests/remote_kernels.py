"""Kernels that the test workers load with `--kernels remote_kernels` (and clients import)."""

import threading

import numpy as np

import actorgraph as ag


def _xor(out, a, b):
    np.bitwise_xor(a, b, out=out)


def _add(out, a, b):
    np.add(a, b, out=out)


def _inc(out, a):
    np.add(a, 1, out=out)


def _scale(out, a, k):
    np.multiply(a, k, out=out)


def _boom(out, a):
    raise ZeroDivisionError("boom on purpose")


XOR = ag.Kernel("xor", cpu=_xor, outs=(0,), ins=(1, 2))
ADD = ag.Kernel("add", cpu=_add, outs=(0,), ins=(1, 2))
INC = ag.Kernel("inc", cpu=_inc, outs=(0,), ins=(1,))
SCALE = ag.Kernel("scale", cpu=_scale, outs=(0,), ins=(1,))
BOOM = ag.Kernel("boom", cpu=_boom, outs=(0,), ins=(1,))

KERNELS = [XOR, ADD, INC, SCALE, BOOM]


def _sleepy(out, a):
    # Holds the worker busy so that a test can kill it while a replay is in flight.
    import time

    time.sleep(30)


SLEEPY = ag.Kernel("sleepy", cpu=_sleepy, outs=(0,), ins=(1,))
KERNELS.append(SLEEPY)


def _gated(out, a):
    # Runs until the file named by ACTORGRAPH_TEST_GATE exists: a remote kernel as slow as
    # a test needs, ended by the test itself rather than by a clock. It sleeps at least
    # once even when the gate is open already (a loaded machine may get to it only after
    # the test opened it), so a worker never sees it run quickly and never learns to run
    # it on its event loop, where a later, closed gate would hold every other client.
    import os
    import time

    path = os.environ["ACTORGRAPH_TEST_GATE"]
    deadline = time.monotonic() + 30
    while True:
        time.sleep(0.005)
        if os.path.exists(path):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} never opened")
    np.copyto(out, a)


GATED = ag.Kernel("gated", cpu=_gated, outs=(0,), ins=(1,))
KERNELS.append(GATED)


INC_GPU_SRC = r"""
extern "C" __global__ void inc_gpu(int *out, const int *a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = a[i] + 1;
}
"""
# For a worker's CUDA devices (the tests run them on the fake driver, with the CPU body).
INC_GPU = ag.Kernel("inc_gpu", cpu=_inc, cuda=INC_GPU_SRC, outs=(0,), ins=(1,))
KERNELS.append(INC_GPU)
BOOM_GPU_SRC = INC_GPU_SRC.replace("inc_gpu", "boom_gpu")  # a GPU cannot raise: its CPU body does
BOOM_GPU = ag.Kernel("boom_gpu", cpu=_boom, cuda=BOOM_GPU_SRC, outs=(0,), ins=(1,))
KERNELS.append(BOOM_GPU)


RELEASE = threading.Event()


def _held(out, a):
    # Runs until a test of this process sets RELEASE: a queue of a worker that runs in the
    # test's own process (its kernels on a thread) held exactly as long as the test needs.
    if not RELEASE.wait(30):
        raise TimeoutError("the test never set remote_kernels.RELEASE")
    np.copyto(out, a)


HELD = ag.Kernel("held", cpu=_held, outs=(0,), ins=(1,))
KERNELS.append(HELD)


_CALLS = [0]


def _counter(out, a):
    # Hidden state: each call adds one more than the last, so two runs of the same work
    # differ (what a replay checker must catch).
    _CALLS[0] += 1
    np.add(a, _CALLS[0], out=out)


COUNTER = ag.Kernel("counter", cpu=_counter, outs=(0,), ins=(1,))
KERNELS.append(COUNTER)
