"""The driver interface's contract, checked on every implementation.

The CUDA device relies on exactly these behaviours; the fake driver must have them so
that tests on it mean something, and the real one (run with `-m gpu` on a GPU machine)
is held to the same suite.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _cuda_kernels import INC_SRC, needs_gpus
from _paths import child_pythonpath
from actorgraph.devices import install_hint
from actorgraph.devices.cuda import CopyKind, CudaDriver, FakeDriver
from actorgraph.devices.cuda._driver import open_driver
from actorgraph.devices.cuda._fake import reached

TIMEOUT = 30  # seconds; only reached if a contract is broken (a hang)


@pytest.fixture(
    params=[
        "fake",
        pytest.param("real", marks=[pytest.mark.gpu, needs_gpus(1)]),
    ]
)
def driver(request: pytest.FixtureRequest) -> Iterator[tuple[CudaDriver, Any]]:
    drv = open_driver(request.param, 0)
    drv.init()
    context = drv.open_context(0)
    drv.set_context(context)
    yield drv, context


def _word(host_pointer: int) -> ctypes.c_uint64:
    return ctypes.c_uint64.from_address(host_pointer)


def _inc_host(drv: CudaDriver, pointer: int, n: int) -> Any:
    view = drv.host_view(pointer, n * 4)
    if view is None:
        return None
    array = view.view(np.int32)
    return lambda: np.add(array, 1, out=array)


def _arch(drv: CudaDriver) -> str:
    return (
        f"sm_{drv.device_attribute(0, 'COMPUTE_CAPABILITY_MAJOR')}"
        f"{drv.device_attribute(0, 'COMPUTE_CAPABILITY_MINOR')}"
    )


def test_mapped_words_are_seen_by_host_and_device(driver: tuple[CudaDriver, Any]) -> None:
    drv, _ = driver
    if not drv.device_attribute(0, "CAN_USE_64_BIT_STREAM_MEM_OPS"):
        pytest.skip("no 64-bit stream memory operations on this device")
    host, device = drv.host_alloc_mapped(8)
    assert host % 8 == 0 and device % 8 == 0
    assert _word(host).value == 0
    stream = drv.stream_create()
    drv.stream_write_value64(stream, device, (1 << 64) - 2)
    drv.stream_synchronize(stream)
    assert _word(host).value == (1 << 64) - 2
    drv.stream_destroy(stream)
    drv.host_free(host)


def test_wait_value_holds_a_stream_until_another_writes(driver: tuple[CudaDriver, Any]) -> None:
    drv, _ = driver
    if not drv.device_attribute(0, "CAN_USE_64_BIT_STREAM_MEM_OPS"):
        pytest.skip("no 64-bit stream memory operations on this device")
    host, device = drv.host_alloc_mapped(8)
    waiter, writer = drv.stream_create(), drv.stream_create()
    seen: list[int] = []
    done = threading.Event()
    drv.stream_wait_value64(waiter, device, 5)
    drv.launch_host_func(waiter, lambda: (seen.append(_word(host).value), done.set()))
    drv.stream_write_value64(writer, device, 3)
    drv.stream_synchronize(writer)
    assert not done.is_set()  # 3 < 5: still held
    drv.stream_write_value64(writer, device, 6)
    assert done.wait(TIMEOUT)
    assert seen == [6]
    drv.stream_synchronize(waiter)
    for s in (waiter, writer):
        drv.stream_destroy(s)
    drv.host_free(host)


def test_event_wait_waits_for_the_latest_record(driver: tuple[CudaDriver, Any]) -> None:
    drv, _ = driver
    host, device = drv.host_alloc_mapped(8)
    a, b = drv.stream_create(), drv.stream_create()
    event = drv.event_create()
    gate = threading.Event()
    order: list[str] = []
    drv.launch_host_func(a, lambda: (gate.wait(TIMEOUT), order.append("a")) and None)
    drv.event_record(event, a)
    drv.stream_wait_event(b, event)
    drv.launch_host_func(b, lambda: order.append("b"))
    gate.set()
    drv.stream_synchronize(b)
    assert order == ["a", "b"]
    drv.event_destroy(event)
    for s in (a, b):
        drv.stream_destroy(s)
    drv.host_free(host)


def test_another_librarys_stream_handle_waits_on_our_events(driver: tuple[CudaDriver, Any]) -> None:
    # DLPack hands us a consumer's stream as an int: wrapped, it waits like our own.
    drv, _ = driver
    ours, theirs = drv.stream_create(), drv.stream_create()
    foreign = drv.wrap_stream(int(theirs))
    gate = threading.Event()
    order: list[str] = []
    drv.launch_host_func(ours, lambda: (gate.wait(TIMEOUT), order.append("ours")) and None)
    event = drv.event_create()
    drv.event_record(event, ours)
    drv.stream_wait_event(foreign, event)
    drv.event_destroy(event)  # the pending wait still holds
    drv.launch_host_func(theirs, lambda: order.append("theirs"))
    gate.set()
    drv.stream_synchronize(theirs)
    assert order == ["ours", "theirs"]
    for s in (ours, theirs):
        drv.stream_destroy(s)


def test_copies_host_device_and_device_device(driver: tuple[CudaDriver, Any]) -> None:
    drv, _ = driver
    n = 1 << 12
    stream = drv.stream_create()
    src_host, _ = drv.host_alloc_mapped(n)
    dst_host, _ = drv.host_alloc_mapped(n)
    data = np.arange(n, dtype=np.uint8)
    ctypes.memmove(src_host, data.ctypes.data, n)
    d1, d2 = drv.mem_alloc(n), drv.mem_alloc(n)
    drv.memcpy(stream, CopyKind.HTOD, d1, src_host, n)
    drv.memcpy(stream, CopyKind.DTOD, d2, d1, n)
    drv.memcpy(stream, CopyKind.DTOH, dst_host, d2, n)
    drv.stream_synchronize(stream)
    out = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(dst_host))
    np.testing.assert_array_equal(out, data)
    for p in (d1, d2):
        drv.mem_free(p)
    for p in (src_host, dst_host):
        drv.host_free(p)
    drv.stream_destroy(stream)


def test_compile_load_and_launch(driver: tuple[CudaDriver, Any]) -> None:
    drv, _ = driver
    n = 256
    image = drv.compile(INC_SRC, "inc_k", _arch(drv))
    assert drv.compile(INC_SRC, "inc_k", _arch(drv)) == image  # cached by source hash
    function = drv.module_function(drv.module_load(image), "inc_k")
    stream = drv.stream_create()
    host, _ = drv.host_alloc_mapped(n * 4)
    buf = drv.mem_alloc(n * 4)
    drv.memcpy(stream, CopyKind.HTOD, buf, host, n * 4)  # zeros
    drv.launch_kernel(
        stream, function, (n // 64, 1, 1), (64, 1, 1), [buf], [n], _inc_host(drv, buf, n)
    )
    drv.memcpy(stream, CopyKind.DTOH, host, buf, n * 4)
    drv.stream_synchronize(stream)
    out = np.ctypeslib.as_array((ctypes.c_int32 * n).from_address(host))
    np.testing.assert_array_equal(out, np.ones(n, np.int32))
    drv.mem_free(buf)
    drv.host_free(host)
    drv.stream_destroy(stream)


def test_graph_build_update_launch(driver: tuple[CudaDriver, Any]) -> None:
    drv, context = driver
    if not drv.device_attribute(0, "CAN_USE_64_BIT_STREAM_MEM_OPS"):
        pytest.skip("no 64-bit stream memory operations on this device")
    n = 256
    function = drv.module_function(
        drv.module_load(drv.compile(INC_SRC, "inc_k", _arch(drv))), "inc_k"
    )
    stream = drv.stream_create()
    word_host, word = drv.host_alloc_mapped(8)
    host, _ = drv.host_alloc_mapped(n * 4)
    a, b = drv.mem_alloc(n * 4), drv.mem_alloc(n * 4)
    for p in (a, b):
        drv.memcpy(stream, CopyKind.HTOD, p, host, n * 4)
    drv.stream_synchronize(stream)
    calls: list[int] = []
    graph = drv.graph_create()
    node = drv.graph_add_kernel(
        graph, None, function, (4, 1, 1), (64, 1, 1), [a], [n], _inc_host(drv, a, n)
    )
    wait = drv.graph_add_wait_value64(graph, node, context, word, 0)
    write = drv.graph_add_write_value64(graph, wait, context, word, 1)
    drv.graph_add_host(graph, write, lambda: calls.append(_word(word_host).value))
    exec_ = drv.graph_instantiate(graph)
    drv.graph_launch(exec_, stream)
    drv.stream_synchronize(stream)
    assert calls == [1]
    drv.graph_exec_kernel_update(
        exec_, node, function, (4, 1, 1), (64, 1, 1), [b], [n], _inc_host(drv, b, n)
    )
    drv.graph_exec_value_update(exec_, wait, context, word, 1, True)
    drv.graph_exec_value_update(exec_, write, context, word, 7, False)
    drv.graph_launch(exec_, stream)
    drv.stream_synchronize(stream)
    assert calls == [1, 7]
    for p, expected in ((a, 1), (b, 1)):
        drv.memcpy(stream, CopyKind.DTOH, host, p, n * 4)
        drv.stream_synchronize(stream)
        out = np.ctypeslib.as_array((ctypes.c_int32 * n).from_address(host))
        np.testing.assert_array_equal(out, np.full(n, expected, np.int32))
    drv.graph_destroy(graph, exec_)
    for p in (a, b):
        drv.mem_free(p)
    drv.host_free(host)
    drv.host_free(word_host)
    drv.stream_destroy(stream)


def test_fake_wait_is_the_drivers_cyclic_comparison() -> None:
    assert reached(5, 5) and reached(6, 5) and not reached(4, 5)
    assert reached(2, (1 << 64) - 2)  # wrapped past 2**64: still later
    assert not reached((1 << 64) - 2, 2)


def test_fake_refuses_kernels_without_a_cpu_body() -> None:
    drv = FakeDriver()
    stream = drv.stream_create()
    with pytest.raises(RuntimeError, match="runs kernels with their CPU bodies"):
        drv.launch_kernel(stream, ("function", "k", b""), (1, 1, 1), (1, 1, 1), [], [])
    drv.stream_destroy(stream)


def test_fake_statistics_count_graph_work() -> None:
    drv = FakeDriver()
    graph = drv.graph_create()
    drv.graph_add_host(graph, None, lambda: None)
    exec_ = drv.graph_instantiate(graph)
    stream = drv.stream_create()
    drv.graph_launch(exec_, stream)
    drv.stream_synchronize(stream)
    stats = drv.statistics()
    assert (stats.graph_instantiations, stats.graph_launches) == (1, 1)
    drv.stream_destroy(stream)


def test_opening_cuda_without_cuda_python_names_the_extra() -> None:
    # cuda-python is an extra now: a CPU-only install has no `cuda.bindings` at all.
    script = (
        "import sys, trio\n"
        "sys.modules['cuda'] = None\n"
        "sys.modules['cuda.bindings'] = None\n"
        "import actorgraph as ag\n"
        "async def main():\n"
        "    async with ag.open_runtime(['CUDA:0']):\n"
        "        pass\n"
        "try:\n"
        "    trio.run(main)\n"
        "except ag.DeviceError as error:\n"
        "    print(error)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ACTORGRAPH_CUDA_DRIVER"}
    env["PYTHONPATH"] = child_pythonpath()
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "cannot open CUDA:0: cuda-python is not installed (import of cuda.bindings halted; "
        f"None in sys.modules); install the cuda extra: {install_hint('cuda')}."
    ), done.stdout
    assert 'pip install -e ".[cuda]" in a checkout of actorgraph' in done.stdout
