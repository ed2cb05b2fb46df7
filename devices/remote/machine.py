"""Compiled CPU programs that a client ships to a worker, and the CPU they are built for.

A worker started with `--allow-programs` runs machine code its clients send: each
`MachineCode` goes once per connection (a `Code` message, by content hash), and a launch
calls it by id (`CodeEntry`). Machine code built for another CPU must never run: at best
it raises SIGILL, which kills the worker and every client's work on it. So the worker
says at connect what it runs on (`WorkerCPU`: the machine and the instruction-set
features a compiler target needs), the client compiles for that and says what the code
needs, and both sides check it (`refusal`): the client before it sends, the worker
before it loads, reading the ELF header's machine as well. Both sides use this module.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import struct
from collections.abc import Iterable

import attrs

from .wire import MAX_CPU_FEATURE_CHARS, MAX_CPU_FEATURES

__all__ = ["MachineCode", "WorkerCPU", "machine_name", "refusal", "sayable"]

# An ELF header's e_machine for the machines a worker may run programs for.
ELF_MACHINES = {"x86_64": 62, "arm64": 183, "riscv64": 243}
_MACHINE_NAMES = {"amd64": "x86_64", "aarch64": "arm64"}


def machine_name(raw: str) -> str:
    """A machine as compilers name it.

    Args:
        raw: the machine as the OS says it (`platform.machine()`: AMD64, aarch64, ...).

    Returns:
        Its compilers' name (x86_64, arm64, riscv64), lower case.
    """
    raw = raw.lower()
    return _MACHINE_NAMES.get(raw, raw)


@attrs.frozen
class WorkerCPU:
    """The CPU a worker runs on, as it says at connect
    (`connection.statistics().worker_cpu`).

    Attributes:
        machine: the machine (`x86_64`, `arm64`, ...).
        features: its instruction-set features, as Linux names them in /proc/cpuinfo
            (`avx2`, `f16c`, ...).
        programs: whether the worker runs shipped programs at all (`--allow-programs`).
    """

    machine: str
    features: frozenset[str] = frozenset()
    programs: bool = False

    @classmethod
    def of_this_host(cls, programs: bool = False) -> WorkerCPU:
        """This host's CPU as a worker says it at connect: its features as many as a
        Welcome carries (see `sayable`)."""
        return cls(machine_name(platform.machine()), sayable(_host_features()), programs)


def sayable(features: Iterable[str]) -> frozenset[str]:
    """The features a worker says it has, of those its CPU names.

    Args:
        features: the CPU's features, as /proc/cpuinfo names them.

    Returns:
        The names of at most MAX_CPU_FEATURE_CHARS characters, the first
        MAX_CPU_FEATURES of them in sorted order (every CPU so far names fewer). One left
        out is taken to be lacking: a program that needs it is refused, never run.
    """
    short = sorted(name for name in features if len(name) <= MAX_CPU_FEATURE_CHARS)
    return frozenset(short[:MAX_CPU_FEATURES])


@functools.cache
def _host_features() -> frozenset[str]:
    """This host's CPU features from /proc/cpuinfo (the first CPU's `flags` on x86,
    `Features` on ARM); none where there is no such file."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def _features(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


@attrs.frozen
class MachineCode:
    """A compiled CPU program a worker runs (`Kernel(name, code=MachineCode(...))`).

    The function takes `buffers` addresses, then `values` 64-bit integers (the launch's
    var values), each passed as a uint64; it is called `global_size[0]` times per launch.
    A worker whose CPU is another machine, or lacks one of `features`, refuses the
    program instead of running it, saying why.

    Args:
        name: the kernel's name, as messages give it.
        image: a relocatable ELF object whose code starts with the function (one function
            per object, as tinygrad's CPU compiler emits), without zero-initialized
            static data (`.bss`).
        machine: the machine it was compiled for (`x86_64`, `arm64`, ...).
        features: the instruction-set extensions it needs, as /proc/cpuinfo names them
            (`avx2`, `f16c`, ...).
        buffers: how many buffer addresses it takes (0 to 64).
        values: how many 64-bit values follow them (0 to 64).
        core_id: the index among the values of the one that numbers the call (0, 1, ...
            up to `global_size[0]`), which the launch does not pass; None when there is
            none.

    Raises:
        ValueError: an empty image, more than 64 buffers or values, or a `core_id` that
            is not one of the values.
    """

    name: str
    image: bytes = attrs.field(repr=lambda image: f"<{len(image)} bytes>")
    machine: str
    features: frozenset[str] = attrs.field(default=frozenset(), converter=_features)
    buffers: int = 0
    values: int = 0
    core_id: int | None = None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.image, bytes) or not self.image:
            raise ValueError(f"MachineCode {self.name!r}: image must be non-empty bytes")
        if not 0 <= self.buffers <= 64 or not 0 <= self.values <= 64:
            raise ValueError(
                f"MachineCode {self.name!r}: buffers and values are 0 to 64 each, got "
                f"{self.buffers} and {self.values}"
            )
        if self.core_id is not None and not 0 <= self.core_id < self.values:
            raise ValueError(
                f"MachineCode {self.name!r}: core_id {self.core_id} is not one of its "
                f"{self.values} values; give the index of the value that numbers the core"
            )

    @functools.cached_property
    def digest(self) -> bytes:
        """The SHA-256 of the image: what a connection ships each program once by."""
        return hashlib.sha256(self.image).digest()

    @property
    def launch_values(self) -> int:
        """The values a launch passes (all but the core number)."""
        return self.values - (self.core_id is not None)


def refusal(
    name: str, image: bytes, machine: str, features: Iterable[str], cpu: WorkerCPU, where: str
) -> str | None:
    """Why a compiled program must not run on a worker's CPU: the check both sides make,
    the client before it sends the program and the worker before it loads it.

    Args:
        name: the program's name, for the reason.
        image: its ELF object (its header's machine and its sections are read).
        machine: the machine it was compiled for (x86_64, arm64, ...).
        features: the CPU features it needs.
        cpu: the worker's CPU, as the worker said it at connect.
        where: names that worker in the reason ("worker 127.0.0.1:7000", "this worker").

    Returns:
        The reason, with the fix, or None when the program may run there.
    """
    if not cpu.programs:
        return (
            f"{where} does not run shipped programs; start it with `actorgraph worker "
            f"--allow-programs ...` to run program {name!r} there (it then runs any "
            f"machine code a client holding its token sends)"
        )
    if machine != cpu.machine:
        return (
            f"program {name!r} was compiled for {machine or 'an unknown machine'}, but {where} "
            f"runs on {cpu.machine}; compile it for {cpu.machine}"
        )
    found = _elf_machine(image)
    if found != ELF_MACHINES.get(machine):
        return (
            f"program {name!r} is not a 64-bit little-endian ELF object for {machine} "
            f"(e_machine {found}); ship what the CPU compiler emits for {machine}"
        )
    unlaid = _zeroed_sections(image)
    if unlaid:
        return (
            f"program {name!r} has zero-initialized static data ({', '.join(unlaid)}), which "
            f"is not laid out with its code: give each static variable a nonzero initial "
            f"value, or pass the memory as a buffer"
        )
    lacking = sorted(set(features) - cpu.features)
    if lacking:
        return (
            f"program {name!r} needs CPU features {', '.join(lacking)} that {where} "
            f"({cpu.machine}) lacks; compile it for that worker's CPU (it said at connect "
            f"what it has) instead of this host's"
        )
    return None


def _elf_machine(image: bytes) -> int | None:
    """The e_machine of a 64-bit little-endian ELF object, or None for anything else."""
    if len(image) < 20 or image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        return None
    return int.from_bytes(image[18:20], "little")


_SHT_NOBITS = 8
_SHF_ALLOC = 2
_SHDR = struct.Struct("<IIQQQQIIQQ")  # an Elf64_Shdr


def _zeroed_sections(image: bytes) -> list[str]:
    """The names of the sections of a 64-bit little-endian ELF object that the program
    needs in memory but whose bytes the object does not hold (SHT_NOBITS: .bss, .tbss):
    the loader lays out only bytes an object holds, so a kernel writing there would
    write over its own code. A malformed table names none (loading it then fails)."""
    if len(image) < 64:
        return []
    (shoff,) = struct.unpack_from("<Q", image, 0x28)
    entsize, count, names_at = struct.unpack_from("<HHH", image, 0x3A)
    if entsize != _SHDR.size or shoff + count * entsize > len(image) or names_at >= count:
        return []
    headers = [_SHDR.unpack_from(image, shoff + k * entsize) for k in range(count)]
    names = headers[names_at]
    found = []
    for name, kind, flags, _, _, size, *_ in headers:
        if kind == _SHT_NOBITS and flags & _SHF_ALLOC and size:
            at = names[4] + name
            end = image.find(b"\0", at)
            found.append(image[at:end].decode("ascii", "replace") if 0 <= at < end else "?")
    return found
