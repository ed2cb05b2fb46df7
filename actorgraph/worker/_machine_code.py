"""Shipped programs a worker runs (`--allow-programs`): checked, loaded, kept per session.

A client ships a compiled CPU program once per content hash (a `Code` message, its
relocatable ELF object in the frame's tail, see devices/remote/machine.py) and calls
it by id (`CodeEntry`). Each session keeps its own (`CodeStore`): another client's ids
are unknown here, as its buffers are. Before a program is loaded its bytes are checked
against the digest it came with, and its CPU against this worker's (`refusal`: the
machine in its ELF header and the one it says, the instruction-set features it says it
needs), so code built for another CPU is refused with a message instead of dying of
SIGILL here. The count and bytes of a session's programs are bounded (`Limits`).

Loading: the object is laid out and relocated by tinygrad's ELF loader (`jit_loader`,
what tinygrad's own CPU device loads its kernels with) into executable memory of the
session's, linked against libm and libgcc_s as tinygrad links its kernels. That is why a
worker that allows programs needs the tinygrad extra (`pip install -e ".[tinygrad]"` in a
checkout): `loader_problem` says so at startup.

What `--allow-programs` trusts: any client holding the worker's token may run any
machine code in the worker's process, with its rights. A kernel that crashes kills the
worker: its clients' calls on it raise ClosedError naming it, as for any lost worker.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import mmap
import sys
from collections.abc import Callable
from typing import Any

from actorgraph.devices import install_hint
from actorgraph.devices.remote.machine import WorkerCPU, refusal
from actorgraph.devices.remote.wire import Code, Limits

from .._kernel import Kernel
from ._lowered import Refused

_INSTALL = install_hint("tinygrad")


def loader_problem() -> str | None:
    """Why this worker cannot load shipped programs, or None when it can."""
    if not sys.platform.startswith("linux"):
        return (
            f"--allow-programs runs shipped CPU programs on Linux workers only (this one runs "
            f"on {sys.platform}); start the worker without it"
        )
    try:
        _jit_loader()
    except ImportError as exc:
        return (
            f"--allow-programs loads shipped CPU programs with tinygrad 0.14's ELF loader, "
            f"which this worker's Python cannot import ({exc}); on the worker, install the tinygrad extra: {_INSTALL}"
        )
    return None


def _jit_loader() -> Callable[..., bytes]:
    """tinygrad's ELF loader (tinygrad 0.14: relocates an object for a load address)."""
    import inspect

    from tinygrad.runtime.support.elf import jit_loader

    if "base" not in inspect.signature(jit_loader).parameters:
        raise ImportError("the installed tinygrad's jit_loader takes no load address (0.14 does)")
    return jit_loader  # type: ignore[no-any-return]


def _link_libraries() -> list[ctypes.CDLL]:
    """What a kernel's calls outside itself resolve against (as tinygrad links them)."""
    libs = []
    for name in (ctypes.util.find_library("m"), "libgcc_s.so.1"):
        if name is None:
            continue
        try:
            libs.append(ctypes.CDLL(name))
        except OSError:
            continue
    return libs


class LoadedCode:
    """A shipped program laid out in executable memory: its function, called as the
    worker's kernel body (`kernel`), which keeps the memory it lives in. Nothing of it
    refers back to it, so the memory is unmapped as soon as neither it nor a kernel
    that may still run refers to it (no cycle left for the collector)."""

    def __init__(self, request: Code, image: bytes) -> None:
        self.name = request.name
        self.buffers = request.buffers
        self.values = request.values
        self.core_id = request.core_id
        self.nbytes = len(image)
        loader = _jit_loader()
        # The loaded size is the object's code and data, at most a little more than the
        # object (an ARM call too far away gets a trampoline): lay it out once to know.
        size = len(loader(image, base=0, link_libs=_link_libraries()))
        memory = mmap.mmap(
            -1,
            max(size, 1),
            mmap.MAP_ANON | mmap.MAP_PRIVATE,
            mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC,
        )
        anchor = ctypes.c_char.from_buffer(memory)
        base = ctypes.addressof(anchor)
        del anchor  # an exported buffer would keep the mapping from ever closing
        loaded = loader(image, base=base, link_libs=_link_libraries())
        memory.write(loaded)
        arguments = [ctypes.c_uint64] * (request.buffers + request.values)
        function = ctypes.CFUNCTYPE(None, *arguments)(base)
        # What the worker's CPU device lowers a call of it with (the planner, the only
        # reader of outs and ins, runs on the client).
        self.kernel = Kernel(
            _kernel_name(request.name),
            cpu=_body(function, memory, request.buffers, request.core_id),
            cpu_args="addresses",
            pass_dims=True,
            outs=(0,),
            ins=tuple(range(request.buffers)),
        )


def _body(
    function: Callable[..., None], memory: mmap.mmap, buffers: int, core_id: int | None
) -> Callable[..., None]:
    """The kernel body: `function` called once per core, `global_size[0]` times, with the
    core's number at `core_id` among its values, as tinygrad calls it. It keeps `memory`,
    where the function lives, for as long as it may be called."""
    slot = None if core_id is None else buffers + core_id

    def body(*args: int, global_size: Any = (1,), local_size: Any = None) -> None:
        values = list(args)
        if slot is not None:
            values.insert(slot, 0)
        for core in range(global_size[0]):
            if slot is not None:
                values[slot] = core
            function(*values)

    body.memory = memory  # type: ignore[attr-defined]
    return body


def _kernel_name(name: str) -> str:
    return name if name.isidentifier() else "shipped_program"


class CodeStore:
    """A session's shipped programs: by the client's id, each loaded once per content
    hash, bounded in count and bytes, refused ids remembered with why."""

    def __init__(self, cpu: WorkerCPU, limits: Limits, where: str) -> None:
        self._cpu = cpu
        self._limits = limits
        self._where = where
        self._by_id: dict[int, LoadedCode] = {}
        self._by_digest: dict[bytes, LoadedCode] = {}
        self._refused: dict[int, str] = {}
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._by_digest)

    def clear(self) -> None:
        """Let go of every program (its client left): each one's memory goes once no
        kernel that may still run refers to it."""
        self._by_id.clear()
        self._by_digest.clear()
        self._refused.clear()
        self.nbytes = 0

    def check(self, request: Code, size: int) -> None:
        """Refuse a Code before its bytes are read: id in use, or over the limits."""
        if request.code in self._by_id or request.code in self._refused:
            raise Refused(f"code id {request.code} is already in use")
        why = None
        if not self._cpu.programs:
            why = refusal(request.name, b"", "", (), self._cpu, self._where)
        elif request.buffers < 1:
            why = f"program {request.name!r} takes no buffer; a kernel writes at least one"
        elif len(self._by_digest) >= self._limits.max_code_count:
            why = (
                f"this client has {len(self._by_digest)} programs on {self._where}, its "
                f"limit; start the worker with a larger --max-programs"
            )
        elif self.nbytes + size > self._limits.max_code_bytes:
            why = (
                f"program {request.name!r} ({size} bytes) would pass this client's "
                f"{self._limits.max_code_bytes} bytes of programs on {self._where}; start the "
                f"worker with a larger --max-program-bytes"
            )
        if why is not None:
            self._refused[request.code] = why
            raise Refused(why)

    def add(self, request: Code, image: bytes) -> None:
        """Check the program's bytes and CPU, then load it (or share the copy loaded under
        another id of the same content). Raises Refused saying why it may not run."""
        try:
            if hashlib.sha256(image).digest() != request.digest:
                raise Refused(
                    f"program {request.name!r}: its bytes do not match its digest; send the "
                    f"SHA-256 of the bytes sent"
                )
            loaded = self._by_digest.get(request.digest)
            if loaded is None:
                why = refusal(
                    request.name,
                    image,
                    request.machine,
                    request.features,
                    self._cpu,
                    self._where,
                )
                if why is not None:
                    raise Refused(why)
                if request.core_id is not None and request.core_id >= request.values:
                    raise Refused(
                        f"program {request.name!r}: core id {request.core_id} is not one of "
                        f"its {request.values} values"
                    )
                loaded = self._load(request, image)
                self._by_digest[request.digest] = loaded
                self.nbytes += loaded.nbytes
            self._by_id[request.code] = loaded
        except Refused as exc:
            self._refused[request.code] = str(exc)
            raise

    @staticmethod
    def _load(request: Code, image: bytes) -> LoadedCode:
        try:
            return LoadedCode(request, image)
        except (RuntimeError, NotImplementedError, AssertionError, ValueError, IndexError) as exc:
            # tinygrad's loader says why it cannot lay the object out (a relocation it
            # does not know, a symbol nothing defines, not an ELF object).
            raise Refused(
                f"program {request.name!r} could not be loaded: {type(exc).__name__}: {exc}"
            ) from None

    def get(self, code_id: int) -> LoadedCode:
        """The program `code_id` names, or Refused saying why there is none."""
        loaded = self._by_id.get(code_id)
        if loaded is None:
            why = self._refused.get(code_id)
            if why is not None:
                raise Refused(f"program id {code_id} was refused: {why}")
            raise Refused(f"unknown program id {code_id} (not shipped by this client)")
        return loaded
