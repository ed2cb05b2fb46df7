"""The real driver where no GPU is: what can be checked without one.

- NVRTC is a compiler, not a driver: with its library installed (the `test` extra brings
  it) the kernels really compile here, to a cubin or, for an arch this NVRTC does not
  know, to PTX.
- Every driver call goes through cuda-python's argument conversion before the bindings
  look for libcuda. Where libcuda is missing, each RealDriver method must therefore fail
  with the same "no driver library" error cuInit gives; a TypeError or AttributeError
  there is a call we wrote wrong (a bad argument type, count, struct field or enum).
  On a GPU machine these calls would reach the driver with made-up handles, so that
  check skips there and the `gpu`-marked tests cover the same calls for real.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import pytest
from _cuda_kernels import INC_SRC, XOR_SRC
from _extras import importorskip
from actorgraph.devices.cuda import CopyKind
from actorgraph.devices.cuda._driver import CudaError
from actorgraph.devices.cuda._real import RealDriver

cu = importorskip("cuda.bindings.driver")
nvrtc = importorskip("cuda.bindings.nvrtc")


@functools.cache
def _nvrtc_archs() -> list[int]:
    try:
        err, archs = nvrtc.nvrtcGetSupportedArchs()
    except Exception:
        return []
    return [int(a) for a in archs]


@functools.cache
def _missing_driver_error() -> type[BaseException] | None:
    """What cuInit raises here because libcuda is missing; None where libcuda loads."""
    try:
        cu.cuInit(0)
    except Exception as exc:
        return type(exc)
    return None


needs_nvrtc = pytest.mark.skipif(
    not _nvrtc_archs(),
    reason='the NVRTC library is not installed: pip install -e ".[test]" in the checkout '
    "(it brings nvidia-cuda-nvrtc) runs these tests",
)
needs_no_driver = pytest.mark.skipif(
    _missing_driver_error() is None, reason="libcuda is present: the gpu tests check these calls"
)


def _driver() -> RealDriver:
    return RealDriver(cu, nvrtc)


# -- NVRTC --


@needs_nvrtc
def test_kernels_compile_to_a_cubin_for_an_arch_nvrtc_knows() -> None:
    driver = _driver()
    arch = f"sm_{_nvrtc_archs()[-1]}"
    image = driver.compile(XOR_SRC, "xor_k", arch)
    assert image[:4] == b"\x7fELF"
    assert driver.compile(XOR_SRC, "xor_k", arch) is image  # cached by source hash
    assert driver.compile(INC_SRC, "inc_k", arch) is not image


@needs_nvrtc
def test_an_arch_newer_than_nvrtc_gets_ptx_for_the_newest_it_knows() -> None:
    newest = _nvrtc_archs()[-1]
    image = _driver().compile(XOR_SRC, "xor_k", f"sm_{newest + 1}")
    text = image.decode()
    assert image.endswith(b"\0")  # cuModuleLoadData reads PTX as a C string
    assert f".target sm_{newest}" in text
    assert ".entry xor_k" in text


@needs_nvrtc
def test_an_arch_older_than_nvrtc_is_refused_with_the_range_it_builds() -> None:
    oldest = _nvrtc_archs()[0]
    with pytest.raises(CudaError, match=rf"builds for sm_{oldest} to sm_\d+, not sm_{oldest - 1}"):
        _driver().compile(XOR_SRC, "xor_k", f"sm_{oldest - 1}")


@needs_nvrtc
def test_a_compile_error_carries_nvrtcs_log_as_text() -> None:
    broken = XOR_SRC.replace("a[i] ^ b[i]", "a[i] ^ c[i]")
    with pytest.raises(CudaError, match=r'identifier "c" is undefined') as info:
        _driver().compile(broken, "xor_k", f"sm_{_nvrtc_archs()[-1]}")
    assert info.value.name == "NVRTC_ERROR_COMPILATION"
    assert "\0" not in str(info.value)


def test_a_missing_nvrtc_library_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoLibrary:
        def nvrtcGetSupportedArchs(self) -> Any:
            raise OSError("libnvrtc.so.13: cannot open shared object file")

    driver = RealDriver(cu, NoLibrary())
    with pytest.raises(
        CudaError,
        match=r'NVRTC_NOT_FOUND: .*install the cuda extra: pip install -e "\.\[cuda\]" in a checkout',
    ):
        driver.compile(XOR_SRC, "xor_k", "sm_90")


# -- every driver call, up to the driver library --

_CTX, _STREAM, _EVENT = cu.CUcontext(0), cu.CUstream(0), cu.CUevent(0)
_FN, _GRAPH, _NODE, _EXEC = cu.CUfunction(0), cu.CUgraph(0), cu.CUgraphNode(0), cu.CUgraphExec(0)
_GRID, _BLOCK = (4, 1, 1), (64, 1, 1)
_TOP = (1 << 64) - 1  # signal values are full 64-bit words


def _calls() -> dict[str, Callable[[RealDriver], Any]]:
    calls: dict[str, Callable[[RealDriver], Any]] = {
        "init": lambda d: d.init(),
        "device_count": lambda d: d.device_count(),
        "open_context": lambda d: d.open_context(0),
        "set_context": lambda d: d.set_context(_CTX),
        "close_context": lambda d: d.close_context(0),
        "device_attribute": lambda d: d.device_attribute(0, "CAN_USE_64_BIT_STREAM_MEM_OPS"),
        "can_access_peer": lambda d: d.can_access_peer(0, 1),
        "enable_peer_access": lambda d: d.enable_peer_access(_CTX, _CTX),
        "mem_alloc": lambda d: d.mem_alloc(1 << 20),
        "mem_free": lambda d: d.mem_free(0x7000_0000),
        "host_alloc_mapped": lambda d: d.host_alloc_mapped(64),
        "host_free": lambda d: d.host_free(0x7000_0000),
        "stream_create": lambda d: d.stream_create(),
        "stream_destroy": lambda d: d.stream_destroy(_STREAM),
        "stream_synchronize": lambda d: d.stream_synchronize(_STREAM),
        "stream_wait_value64": lambda d: d.stream_wait_value64(_STREAM, 0x7000_0000, _TOP),
        "stream_write_value64": lambda d: d.stream_write_value64(_STREAM, 0x7000_0000, _TOP),
        "launch_host_func": lambda d: d.launch_host_func(_STREAM, lambda: None),
        "event_create": lambda d: d.event_create(),
        "event_destroy": lambda d: d.event_destroy(_EVENT),
        "event_record": lambda d: d.event_record(_EVENT, _STREAM),
        "stream_wait_event": lambda d: d.stream_wait_event(_STREAM, _EVENT),
        "module_load": lambda d: d.module_load(b"\x7fELF"),
        "module_function": lambda d: d.module_function(cu.CUmodule(0), "xor_k"),
        "launch_kernel": lambda d: d.launch_kernel(
            _STREAM, _FN, _GRID, _BLOCK, [0x7000_0000, 0x7000_1000], [-(2**31), 2**31 - 1]
        ),
        "graph_create": lambda d: d.graph_create(),
        "graph_add_kernel first": lambda d: d.graph_add_kernel(
            _GRAPH, None, _FN, _GRID, _BLOCK, [0x7000_0000], [7]
        ),
        "graph_add_kernel after": lambda d: d.graph_add_kernel(
            _GRAPH, _NODE, _FN, _GRID, _BLOCK, [0x7000_0000], [7]
        ),
        "graph_add_wait_value64": lambda d: d.graph_add_wait_value64(
            _GRAPH, _NODE, _CTX, 0x7000_0000, _TOP
        ),
        "graph_add_write_value64": lambda d: d.graph_add_write_value64(
            _GRAPH, _NODE, _CTX, 0x7000_0000, _TOP
        ),
        "graph_add_host": lambda d: d.graph_add_host(_GRAPH, _NODE, lambda: None),
        "graph_instantiate": lambda d: d.graph_instantiate(_GRAPH),
        "graph_exec_kernel_update": lambda d: d.graph_exec_kernel_update(
            _EXEC, _NODE, _FN, _GRID, _BLOCK, [0x7000_0000], [7]
        ),
        "graph_exec_value_update wait": lambda d: d.graph_exec_value_update(
            _EXEC, _NODE, _CTX, 0x7000_0000, 3, True
        ),
        "graph_exec_value_update write": lambda d: d.graph_exec_value_update(
            _EXEC, _NODE, _CTX, 0x7000_0000, 3, False
        ),
        "graph_launch": lambda d: d.graph_launch(_EXEC, _STREAM),
        "memset_zero": lambda d: d.memset_zero(_STREAM, 0x7000_0000, 256),
        "graph_destroy": lambda d: d.graph_destroy(_GRAPH, _EXEC),
    }
    for kind in CopyKind:
        calls[f"memcpy {kind.name}"] = functools.partial(
            lambda d, k: d.memcpy(_STREAM, k, 0x7000_0000, 0x7100_0000, 256, _CTX, _CTX), k=kind
        )
        calls[f"graph_add_memcpy {kind.name}"] = functools.partial(
            lambda d, k: d.graph_add_memcpy(_GRAPH, _NODE, _CTX, k, 0x7000_0000, 0x7100_0000, 256),
            k=kind,
        )
        calls[f"graph_exec_memcpy_update {kind.name}"] = functools.partial(
            lambda d, k: d.graph_exec_memcpy_update(
                _EXEC, _NODE, _CTX, k, 0x7000_0000, 0x7100_0000, 256
            ),
            k=kind,
        )
    return calls


def test_every_driver_method_has_a_marshalling_check() -> None:
    from actorgraph.devices.cuda._driver import CudaDriver

    protocol = {name for name in vars(CudaDriver) if not name.startswith("_") and name != "name"}
    checked = {name.split()[0] for name in _calls()} | {"compile", "host_write64", "host_view"}
    assert protocol - checked == {"wrap_stream"}  # no driver call: checked below


def test_a_wrapped_stream_handle_is_the_bindings_stream_of_that_address() -> None:
    stream = _driver().wrap_stream(0x7F00_0000_1000)
    assert isinstance(stream, cu.CUstream) and int(stream) == 0x7F00_0000_1000


@needs_no_driver
@pytest.mark.parametrize("call", sorted(_calls()))
def test_every_call_gets_through_argument_conversion(call: str) -> None:
    missing = _missing_driver_error()
    assert missing is not None
    with pytest.raises(missing):
        _calls()[call](_driver())


def test_host_functions_reach_their_callable_through_the_c_trampoline() -> None:
    driver = _driver()
    seen: list[str] = []
    once = driver._token(lambda: seen.append("once"), once=True)
    kept = driver._token(lambda: seen.append("kept"), once=False)
    address = ctypes.cast(driver._trampoline, ctypes.c_void_p).value
    trampoline = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)
    for token in (once, once, kept, kept):
        trampoline(token)
    assert seen == ["once", "kept", "kept"]  # a one-shot token is gone after its call
