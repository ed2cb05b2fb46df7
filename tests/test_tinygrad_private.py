"""The private parts of tinygrad that actorgraph.tinygrad relies on (all in
actorgraph/tinygrad/_private.py), each checked against the installed release, so a
tinygrad that changes one fails here with a message naming what changed and why it
matters, not somewhere deep in a replay."""

from __future__ import annotations

import ctypes
import inspect
import os
import shutil
from typing import Any

import numpy as np
import pytest
from _extras import NO_CLANG, importorskip

os.environ.setdefault("DEV", "CPU")
importorskip("tinygrad")
if shutil.which(os.environ.get("CC", "clang")) is None:
    pytest.skip(NO_CLANG, allow_module_level=True)

from tinygrad import Device, Tensor, TinyJit  # noqa: E402

from actorgraph import tinygrad as agt  # noqa: E402
from actorgraph.tinygrad import _private  # noqa: E402

VERSION = agt.TINYGRAD_VERSION
V011 = VERSION == "0.11.0"


def changed(what: str, hook: str, why: str) -> str:
    return (
        f"tinygrad {VERSION} changed {what}: actorgraph.tinygrad._private.{hook} relies on it "
        f"to {why}; update that function (and only it) for this release"
    )


def _realized(values: list[float]) -> Tensor:
    return Tensor(np.array(values, np.float32), device="CPU").realize()


def test_buffer_address_is_the_host_memory_of_a_cpu_buffer() -> None:
    t = _realized([1.5, 2.5, 3.5])
    buf = t.uop.base.buffer
    try:
        address = _private.buffer_address(buf)
    except AttributeError as error:
        pytest.fail(
            changed(
                f"Buffer._buf.va_addr ({error})",
                "buffer_address",
                "wrap tinygrad's memory by address",
            )
        )
    seen = np.ctypeslib.as_array((ctypes.c_float * 3).from_address(address))
    assert seen.tolist() == [1.5, 2.5, 3.5], changed(
        "what Buffer._buf.va_addr points at", "buffer_address", "wrap tinygrad's memory by address"
    )


def test_buffer_base_names_the_base_of_a_view() -> None:
    t = _realized([0.0] * 8)
    base = t.uop.base.buffer
    view = (
        base.view(4, base.dtype, 8)
        if not V011
        else type(base)(base.device, 4, base.dtype, base=base, offset=8)
    )
    assert _private.buffer_base(view) is base and _private.buffer_base(base) is None, changed(
        "Buffer._base", "buffer_base", "find which input or held buffer a view lies in"
    )


def test_patching_cpu_devices_reaches_open_and_later_devices() -> None:
    class Marker:
        pass

    Device["CPU"]  # open now
    restore = _private.patch_cpu_devices(Marker)
    try:
        later = Device["CPU:3"]
        assert Device["CPU"].graph is Marker and later.graph is Marker, changed(
            "how a CPU device keeps its graph class (Compiled.graph, CPUDevice.__init__)",
            "patch_cpu_devices",
            "be the graph runner of CPU devices opened before and after install()",
        )
    finally:
        restore()
    assert Device["CPU"].graph is not Marker


def test_a_registered_device_kind_is_found_by_tinygrads_own_lookup() -> None:
    if V011:
        pytest.skip("AG devices are tinygrad 0.14's (0.11 keeps its own REMOTE device)")
    from tinygrad.device import Compiled

    opened: list[str] = []

    class ZzDevice(Compiled):  # type: ignore[misc]
        def __init__(self, device: str) -> None:
            opened.append(device)

    restore = _private.register_device("ZZ", ZzDevice)
    try:
        try:
            first, second = Device["ZZ"], Device["zz:1"]
        except (ImportError, IndexError) as error:
            pytest.fail(
                changed(
                    f"how Device[...] finds a device's class ({error!r})",
                    "register_device",
                    "make AG, AG:1, ... tinygrad devices",
                )
            )
        assert isinstance(first, ZzDevice) and isinstance(second, ZzDevice)
        assert opened == ["ZZ", "ZZ:1"], changed(
            "the device names a device class is opened with", "register_device", "number AG devices"
        )
        assert {"ZZ", "ZZ:1"} <= set(_private.opened_devices()), changed(
            "Device._opened_devices", "opened_devices", "give back cached AG memory at uninstall"
        )
        from tinygrad.schedule import rangeify

        assert rangeify.DEVICE_MAX_BUFS["ZZ"] == rangeify.DEVICE_MAX_BUFS["CPU"], changed(
            "DEVICE_MAX_BUFS",
            "register_device",
            "keep AG kernels within the CPU loader's arguments",
        )
    finally:
        restore()
    from tinygrad.schedule import rangeify

    assert "ZZ" not in rangeify.DEVICE_MAX_BUFS


def test_a_graph_runner_is_built_and_called_as_actorgraph_builds_and_calls_one() -> None:
    from tinygrad.engine.jit import MultiGraphRunner

    init = inspect.signature(MultiGraphRunner.__init__)
    call = inspect.signature(MultiGraphRunner.__call__)
    if V011:
        expected_init, expected_call = ["self", "jit_cache", "input_rawbuffers", "var_vals"], None
        assert hasattr(MultiGraphRunner, "supports_exec_item")
    else:
        expected_init = ["self", "linear", "input_uops"]
        expected_call = ["self", "input_uops", "var_vals", "wait"]
        assert hasattr(MultiGraphRunner, "supports_uop"), changed(
            "GraphRunner.supports_uop", "(the runner's supports_uop)", "refuse calls it cannot run"
        )
    assert list(init.parameters) == expected_init, changed(
        f"GraphRunner.__init__{init}", "(the adapter's ActorGraph)", "build a runner per batch"
    )
    if expected_call is not None:
        assert list(call.parameters) == expected_call, changed(
            f"GraphRunner.__call__{call}", "(the adapter's ActorGraph)", "replay a batch"
        )


def test_prepare_jit_inputs_returns_what_tinygrads_call_uses() -> None:
    x = _realized([1.0, 2.0])
    got: Any = _private.prepare_jit_inputs((x,), {})
    assert len(got) == 4 and got[2] == [0], changed(
        "_prepare_jit_inputs (engine/jit.py)",
        "prepare_jit_inputs",
        "check a JitGraph's arguments as TinyJit does: (inputs, var values, names, layouts)",
    )


@pytest.mark.skipif(V011, reason="tinygrad 0.14: its jit copies inputs it writes")
def test_written_inputs_are_the_buffers_a_captured_jit_writes() -> None:
    w = _realized([2.0] * 4)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return ((x * w).realize() + 1).realize()

    y = _realized([1.0] * 4)
    for _ in range(3):
        y = step(y)
    assert step.captured is not None
    assert y.uop.base in _private.written_inputs(step.captured), changed(
        "CapturedJit._written_uops",
        "written_inputs",
        "copy an input the jit also writes before the trio path replays it",
    )


@pytest.mark.skipif(not V011, reason="tinygrad 0.11: its CPU devices keep timelines")
def test_timelines_of_a_cpu_device() -> None:
    dev = Device["CPU"]
    dev.synchronize()
    pending = _private.timeline_pending(dev)
    assert _private.timeline_read(dev) >= pending
    taken = _private.timeline_take(dev)
    assert taken == pending + 1 and _private.timeline_pending(dev) == taken, changed(
        "timeline_value / next_timeline()", "timeline_take", "order replays with queued work"
    )
    _private.timeline_write(dev, taken)
    assert _private.timeline_read(dev) == taken, changed(
        "timeline_signal.value", "timeline_write", "release tinygrad's work after a replay"
    )


@pytest.mark.skipif(not V011, reason="tinygrad 0.11: CompiledRunner holds the program")
def test_compiled_function_is_the_loaded_cpu_program() -> None:
    @TinyJit
    def double(x: Tensor) -> Tensor:
        return (x * 2).realize()

    for _ in range(3):
        double(_realized([1.0, 2.0]))
    runner = double.captured.jit_cache[0].prg
    assert getattr(_private.compiled_function(runner), "fxn", None) is not None, changed(
        "CompiledRunner._prg", "compiled_function", "call a kernel's C function directly"
    )


def test_watch_cpu_memory_tells_what_tinygrad_lets_go_of() -> None:
    import gc

    from tinygrad import dtypes
    from tinygrad.helpers import Context

    seen: list[tuple[str, str, int, int]] = []
    armed = [True]  # the hooks stay for good: record only while this test runs

    def record(kind: str) -> Any:
        return lambda device, address, nbytes: (
            armed[0] and seen.append((kind, device, address, nbytes))
        )

    _private.watch_cpu_memory(record("deallocated"), record("released"))
    why = "let go of wrappers of memory tinygrad freed"
    try:
        for lru in (1, 0):
            with Context(LRU=lru):
                t = Tensor(np.arange(1000, dtype=np.float32), device="CPU:1").realize()
                address = _private.buffer_address(t.uop.base.buffer)
                Device["CPU:1"].synchronize()  # 0.11: no queued work may use it once freed
                del t
                gc.collect()
            told = {kind for kind, *place in seen if place == ["CPU:1", address, 4000]}
            want = {"deallocated"} if lru else {"deallocated", "released"}
            assert told == want, changed(
                f"how a CPU buffer is freed (LRU={lru}: told {told})", "watch_cpu_memory", why
            )
        memory = np.zeros(10, np.float32)
        blob = Tensor.from_blob(memory.ctypes.data, (10,), dtype=dtypes.float32, device="CPU")
        (blob + 1).realize()
        Device["CPU"].synchronize()
        del blob
        gc.collect()
        told = {kind for kind, *place in seen if place == ["CPU", memory.ctypes.data, 40]}
        assert told == {"deallocated", "released"}, changed(
            f"how a buffer over memory it does not own is freed (told {told})",
            "watch_cpu_memory",
            why,
        )
    finally:
        armed[0] = False
