"""tinygrad 0.14's `AG` devices: the CPU devices of actorgraph workers, as tinygrad devices.

`install(remote=[...])` opens the worker devices named there on its background runtime
and registers `AG` with tinygrad's own device lookup (`_private.register_device`): `AG`
is the first of them, `AG:1` the second, ... Each is a tinygrad `Compiled` device:

- memory (`AGAllocator`): an `AGMemory` per buffer, allocated on the worker when work
  first uses it; tinygrad's LRU cache keeps freed ones for reuse, as on its own devices.
  Copies in take the bytes at once (tinygrad may reuse them), copies out and
  `synchronize()` wait; copies between two AG devices go worker to worker.
- kernels (`AGProgram`): tinygrad's CPU compiler (clang) builds each kernel for the
  worker's CPU, as the worker said at connect (`cpu_target`: its machine and the
  x86-64 level or ARM baseline it has), not for this host's; a call ships the program
  once (a `MachineCode` kernel) and records the launch.
- every call is recorded (_pending.py) and goes with the next read: one batch per worker.
- the graph runner is `ActorGraph` (_v014.py), which takes batches over AG devices and the
  CPU devices install() opened as one actorgraph graph.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from tinygrad.device import BufferSpec, Compiled, LRUAllocator
from tinygrad.renderer.cstyle import ClangRenderer

from .._errors import ClosedError, UsageError
from .._kernel import Kernel
from ..remote import MachineCode, WorkerCPU
from ._pending import AGMemory, CopyRecord, FreeRecord, LaunchRecord, Pending, WriteRecord

# x86-64 microarchitecture levels, highest first, each with the CPU features (as
# /proc/cpuinfo names them) it needs beyond the level below.
_X86_LEVELS = (
    ("x86-64-v4", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")),
    ("x86-64-v3", ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")),
    ("x86-64-v2", ("cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3")),
)


def cpu_target(cpu: WorkerCPU, where: str) -> tuple[str, frozenset[str]]:
    """(tinygrad's arch string for the CPU compiler, the features it builds for) for a
    worker of this CPU: the highest x86-64 level it has all of, or ARM's baseline."""
    if cpu.machine == "x86_64":
        for index, (level, _) in enumerate(_X86_LEVELS):
            needed = frozenset(f for _, features in _X86_LEVELS[index:] for f in features)
            if needed <= cpu.features:
                return f"x86_64,{level}", needed
        return "x86_64,x86-64", frozenset()
    if cpu.machine == "arm64":
        return "arm64,generic", frozenset()
    raise UsageError(
        f"{where} runs on {cpu.machine or 'a CPU it did not name'}; tinygrad's AG devices "
        f"compile kernels for x86_64 and arm64 workers only: use a worker on one of those"
    )


def target_features(arch: str) -> tuple[str, frozenset[str]]:
    """(machine, CPU features) code compiled for tinygrad's CPU arch string needs: those
    of its x86-64 level, none for ARM's baseline, and this host's own for `native`."""
    machine, _, rest = arch.partition(",")
    cpu, *extra = rest.split(",")
    if cpu == "native":
        return machine, WorkerCPU.of_this_host().features | set(extra)
    for index, (level, _) in enumerate(_X86_LEVELS):
        if cpu == level:
            needed = {f for _, features in _X86_LEVELS[index:] for f in features}
            return machine, frozenset(needed | {f for f in extra if not f.startswith("-")})
    return machine, frozenset(f for f in extra if not f.startswith("-"))


def check_worker(name: str, cpu: WorkerCPU) -> None:
    """Refuse a worker device that cannot be an AG device: its worker runs no shipped
    programs, or on a CPU the compiler here does not build for."""
    where = f"worker device {name}"
    if not cpu.programs:
        raise UsageError(
            f"{where} cannot be a tinygrad AG device: its worker does not run shipped "
            f"programs (tinygrad's kernels); start it with `actorgraph worker "
            f"--allow-programs ...`"
        )
    cpu_target(cpu, where)


def _state(device: str) -> Any:
    from ._install import current

    state = current()
    if state is None or not state.remote:
        raise ClosedError(
            f"tinygrad device {device} is an actorgraph worker device, and actorgraph.tinygrad "
            f"is not installed with remote devices; call install(remote=['CPU:0@HOST:PORT', ...]) "
            f"(or set ACTORGRAPH_REMOTE) before using it"
        )
    return state


def _owner() -> Pending | None:
    """The work queue of the current install() (None when not installed)."""
    from ._install import current

    state = current()
    pending: Pending | None = None if state is None else state.pending
    return pending


def release_cached(device_names: Any) -> None:
    """Give back the memory tinygrad's caches of these opened AG devices keep (their
    LRU of freed buffers), as frees recorded for the workers."""
    from tinygrad.device import Device

    for name in device_names:
        if name.split(":")[0] == "AG":
            Device[name].allocator.free_cache()


def remote_index(device: str) -> int:
    """0 for AG, 1 for AG:1, ..."""
    _, _, index = device.partition(":")
    if index and not index.isdigit():
        raise UsageError(
            f"tinygrad device {device!r} is not an AG device name; AG devices are AG, AG:1, "
            f"AG:2, ... (the part after the colon is its number)"
        )
    return int(index or 0)


class AGAllocator(LRUAllocator):  # type: ignore[misc]
    """Memory of an AG device: allocated on its worker, copies recorded for the next read."""

    def __init__(self, dev: AGDevice) -> None:
        super().__init__(dev, supports_copy_from_disk=False, supports_transfer=True)

    def alloc(self, size: int, options: BufferSpec | None = None) -> AGMemory:
        memory: AGMemory = super().alloc(size, options)
        while memory.owner is not self.dev.pending:  # cached under an earlier install()
            memory = super().alloc(size, options)
        return memory

    def free(self, opaque: AGMemory, size: int, options: BufferSpec | None = None) -> None:
        opaque.release()  # a jit that held it holds it no more (Batch.stale)
        if opaque.owner is _owner():  # else it went with an earlier install(): drop it
            super().free(opaque, size, options)

    def _alloc(self, size: int, options: BufferSpec) -> AGMemory:
        if options.external_ptr is not None:
            raise UsageError(
                f"tinygrad device {self.dev.device} holds memory on a worker, and "
                f"Tensor.from_blob (an external pointer) names host memory; make the tensor "
                f"on a CPU device and move it with .to({self.dev.device!r})"
            )
        return AGMemory(self.dev.remote_name, size, owner=self.dev.pending)

    def _free(self, opaque: AGMemory, options: BufferSpec) -> None:
        if opaque.base is None and opaque.owner is _owner():
            self.dev.pending.add(FreeRecord(opaque))

    def _offset(self, buf: AGMemory, size: int, offset: int) -> AGMemory:
        return buf.view(size, offset)

    def _copyin(self, dest: AGMemory, src: memoryview) -> None:
        data = np.frombuffer(src, np.uint8).copy()  # tinygrad may reuse its bytes at once
        self.dev.pending.add(WriteRecord(dest, data))

    def _copyout(self, dest: memoryview, src: AGMemory) -> None:
        self.dev.pending.read(dest.cast("B") if dest.format != "B" else dest, src)

    def _transfer(
        self, dest: AGMemory, src: AGMemory, sz: int, src_dev: Any, dest_dev: Any
    ) -> None:
        self.dev.pending.add(CopyRecord(dest, src if src.nbytes == sz else src.view(sz, 0)))


class AGProgram:
    """A kernel compiled for an AG device's worker: a call records its launch, shipping
    the compiled object once per worker connection (a MachineCode kernel)."""

    def __init__(self, dev: AGDevice, obj: Any) -> None:
        self.dev = dev
        self.name = obj.name
        self.lib = bytes(obj.lib)
        # What the compiler built it for (the worker's CPU, unless DEV said otherwise).
        self.machine, self.features = target_features(obj.target.arch)
        # Where the core number goes among the arguments (tinygrad's threaded kernels).
        self.core_slot: int | None = next(
            (slot for name, slot, *_ in obj.signature if name == "core_id"), None
        )
        self._kernels: dict[tuple[Any, ...], Kernel] = {}

    def machine_code(self, buffers: int, values: int, core_id: int | None) -> MachineCode:
        return MachineCode(
            self.name,
            self.lib,
            self.machine,
            self.features,
            buffers=buffers,
            values=values,
            core_id=core_id,
        )

    def kernel(
        self,
        buffers: int,
        values: int,
        outs: tuple[int, ...] | None = None,
        ins: tuple[int, ...] = (),
    ) -> Kernel:
        """The kernel a launch of it is (`outs` None: every buffer may be written, as a
        call of tinygrad's program does not say which ones it writes)."""
        key = (buffers, values, outs, ins)
        found = self._kernels.get(key)
        if found is None:
            core = None if self.core_slot is None else self.core_slot - buffers
            code = self.machine_code(buffers, values, core)
            written = tuple(range(buffers)) if outs is None else outs
            name = self.name if self.name.isidentifier() else "tinygrad_kernel"
            found = Kernel(name, code=code, outs=written, ins=ins or tuple(range(buffers)))
            self._kernels[key] = found
        return found

    def __call__(
        self,
        *bufs: AGMemory,
        global_size: tuple[int, ...] = (1, 1, 1),
        local_size: tuple[int, ...] | None = (1, 1, 1),
        vals: tuple[int | None, ...] = (),
        wait: bool = False,
        timeout: int | None = None,
    ) -> float | None:
        kernel = self.kernel(len(bufs), len(vals))
        values = [int(v) for v in vals if v is not None]  # None: the core number
        self.dev.pending.add(LaunchRecord(kernel, bufs, values, tuple(global_size)))
        if not wait:
            return None
        start = time.perf_counter()
        self.dev.synchronize()
        return time.perf_counter() - start


class AGDevice(Compiled):  # type: ignore[misc]
    """An actorgraph worker's device as a tinygrad device (see the module's docstring)."""

    def __init__(self, device: str) -> None:
        self._index = remote_index(device)
        self._target: tuple[Any, str] | None = None
        self._where(device)  # refused now if there is no such device
        from ._v014 import ActorGraph

        super().__init__(device, AGAllocator(self), [ClangRenderer], AGProgram, graph=ActorGraph)

    def _where(self, device: str) -> tuple[str, Any]:
        state = _state(device)
        if self._index >= len(state.remote):
            names = ", ".join(["AG"] + [f"AG:{i}" for i in range(1, len(state.remote))])
            raise UsageError(
                f"tinygrad device {device} is not one of the {len(state.remote)} worker "
                f"devices install(remote=...) opened ({names}); name more devices there"
            )
        return state.remote[self._index], state

    @property
    def remote_name(self) -> str:
        """The worker device it is under the current install() (tinygrad keeps a device
        open across installs, and each may name another worker)."""
        return self._where(self.device)[0]

    @property
    def arch(self) -> str:
        """The CPU compiler's target: the current worker's CPU (tinygrad reads it each
        time it picks the renderer, and keeps one renderer per target)."""
        name, state = self._where(self.device)
        if self._target is None or self._target[0] is not state:
            arch, _ = cpu_target(state.worker_cpu(name), f"worker device {name}")
            self._target = (state, arch)
        return self._target[1]

    @arch.setter
    def arch(self, value: Any) -> None:
        pass  # tinygrad's Compiled sets it once; the worker's CPU decides (see above)

    @property
    def pending(self) -> Pending:
        state = _state(self.device)
        pending: Pending = state.pending
        return pending

    def synchronize(self) -> None:
        self.pending.flush(wait=True)
