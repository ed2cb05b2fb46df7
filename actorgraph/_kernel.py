"""Kernels and the jit-cache items that use them: Launch and Copy."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

import attrs

from actorgraph.devices import check_kernel_cost
from actorgraph.devices.remote import MachineCode

from ._await import described
from ._buffer import Buffer
from ._errors import UsageError
from ._vars import Expr, IntLike, Var, variables_of


def _slots(name: str, value: Any) -> tuple[int, ...]:
    out = tuple(value)
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in out):
        raise UsageError(f"Kernel {name} must list buffer slots as ints >= 0, got {value!r}")
    return out


def _outs(value: Any) -> tuple[int, ...]:
    return _slots("outs", value)


def _ins(value: Any) -> tuple[int, ...]:
    return _slots("ins", value)


@attrs.frozen(eq=False)
class Kernel:
    """A named kernel with a body per device kind.

    `ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,),
    ins=(1, 2))`: the planner orders launches by the slots a kernel writes and reads.

    Args:
        name: an identifier; a CUDA source's entry point, and a worker finds the kernel by
            it.
        cpu: the body on CPU and SIM devices (and the fake CUDA driver), called as
            `fn(*views, *var_values)`: a numpy view per buffer, then the launch's Var values
            (plus `global_size=` and `local_size=` keywords with `pass_dims=True`).
        cuda: CUDA C source with an `extern "C" __global__` entry point named `name`,
            compiled by NVRTC for CUDA devices.
        outs: the buffer slots it writes.
        ins: the buffer slots it reads (a slot may be in both).
        cost: how long a launch takes on SIM devices: seconds, an `ag.Work(flops=...,
            nbytes=...)`, or `fn(buffer_nbytes, var_values)` returning either; by default
            the bytes its buffers hold over the memory bandwidth.
        pass_dims: also pass the launch's `global_size=` and `local_size=` to `cpu`.
        cpu_args: "arrays" (numpy views) or "addresses" (each buffer's host address as an
            int, for compiled code that takes pointers).
        code: compiled machine code (an `ag.remote.MachineCode`) that a worker started
            with `--allow-programs` runs on its CPU devices, shipped to each worker once.

    Raises:
        UsageError: a name that is no identifier, no body, a `cpu` that is not callable, a
            `code` that is no MachineCode, no written slot, slots that are not ints >= 0,
            an unknown `cpu_args`, or a bad `cost`.
    """

    name: str
    cpu: Callable[..., Any] | None = None
    cuda: str | None = None
    outs: tuple[int, ...] = attrs.field(default=(), converter=_outs)
    ins: tuple[int, ...] = attrs.field(default=(), converter=_ins)
    cost: Any = None
    pass_dims: bool = False
    cpu_args: str = "arrays"
    code: MachineCode | None = None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise UsageError(f"Kernel name must be an identifier, got {self.name!r}")
        if self.cpu_args not in ("arrays", "addresses"):
            raise UsageError(
                f"Kernel {self.name!r}: cpu_args is 'arrays' (numpy views) or 'addresses' "
                f"(host addresses as ints), got {self.cpu_args!r}"
            )
        if self.cpu is None and self.cuda is None and self.code is None:
            raise UsageError(
                f"Kernel {self.name!r} has no body; give cpu=fn, cuda=SOURCE and/or "
                f"code=ag.remote.MachineCode(...)"
            )
        if self.code is not None and not isinstance(self.code, MachineCode):
            raise UsageError(
                f"Kernel {self.name!r}: code= takes an ag.remote.MachineCode, got {self.code!r}"
            )
        if self.cpu is not None and not callable(self.cpu):
            raise UsageError(f"Kernel {self.name!r}: cpu= must be callable, got {self.cpu!r}")
        if not self.outs:
            raise UsageError(
                f"Kernel {self.name!r} writes no buffer: list the written slots in outs=(...)"
            )
        try:
            check_kernel_cost(self.name, self.cost)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, outs={self.outs}, ins={self.ins})"


Dims = Union[IntLike, Sequence[IntLike], None]

_NO_VARS: frozenset[Var] = frozenset()


def _dims(value: Dims) -> tuple[IntLike, ...] | None:
    if value is None:
        return None
    dims = (value,) if isinstance(value, (int, Expr)) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(
        isinstance(d, bool) or not isinstance(d, (int, Expr)) for d in dims
    ):
        raise UsageError(f"launch dims are 1 to 3 ints or Var expressions, got {value!r}")
    return dims


def _fixedvars(value: Mapping[Var, int] | Sequence[tuple[Var, int]]) -> tuple[tuple[Var, int], ...]:
    pairs = tuple(value.items()) if isinstance(value, Mapping) else tuple(value)
    for var, val in pairs:
        if not isinstance(var, Var):
            raise UsageError(f"fixedvars keys must be Vars, got {var!r}")
        var.check(val)
    return pairs


def _vars(value: Iterable[Var]) -> tuple[Var, ...]:
    return tuple(value)  # each checked to be a Var in __attrs_post_init__


def _buffers(value: Sequence[Buffer]) -> tuple[Buffer, ...]:
    bufs = tuple(value)
    for i, buf in enumerate(bufs):
        if not isinstance(buf, Buffer):
            raise UsageError(f"buffer slot {i} must be an actorgraph Buffer, got {described(buf)}")
    return bufs


@attrs.frozen(eq=False)
class Launch:
    """A kernel launch over buffers, an item of `rt.run` and `rt.compile`.

    Launch dimensions may be expressions of Vars (`ag.cdiv(n, 256)`), evaluated per call.

    Args:
        kernel: the Kernel.
        bufs: one buffer (or view) per slot of the kernel, all on one device.
        vars: the Vars whose values the kernel body takes after the buffers.
        fixedvars: Var values fixed for this launch (a mapping or pairs), `{n: 4096}`.
        global_size: the grid: 1 to 3 ints or Var expressions (CUDA blocks).
        local_size: the block: 1 to 3 ints or Var expressions (CUDA threads).

    Raises:
        UsageError: a kernel that is no Kernel, no buffers, a slot the kernel uses without a
            buffer or a buffer in no slot, buffers on several devices, vars that are no
            Vars, or bad launch dimensions.
        VarError: a fixed value outside its Var's bounds.
    """

    kernel: Kernel
    bufs: tuple[Buffer, ...] = attrs.field(converter=_buffers)
    vars: tuple[Var, ...] = attrs.field(default=(), converter=_vars)
    fixedvars: tuple[tuple[Var, int], ...] = attrs.field(factory=tuple, converter=_fixedvars)
    global_size: tuple[IntLike, ...] | None = attrs.field(default=None, converter=_dims)
    local_size: tuple[IntLike, ...] | None = attrs.field(default=None, converter=_dims)

    def __attrs_post_init__(self) -> None:
        kernel = self.kernel
        if not isinstance(kernel, Kernel):
            raise UsageError(f"Launch needs an actorgraph Kernel, got {kernel!r}")
        nslots = len(self.bufs)
        for slot in kernel.outs + kernel.ins:
            if slot >= nslots:
                raise UsageError(
                    f"Kernel {kernel.name!r} uses buffer slot {slot} but the Launch passes "
                    f"{nslots} buffers; pass one buffer per slot"
                )
        for slot in range(nslots):
            if slot not in kernel.outs and slot not in kernel.ins:
                raise UsageError(
                    f"buffer slot {slot} of Kernel {kernel.name!r} is in neither outs nor ins; "
                    f"say whether the kernel reads or writes it"
                )
        if not self.bufs:
            raise UsageError(f"Launch of {kernel.name!r} has no buffers")
        devices = {b.device for b in self.bufs}
        if len(devices) > 1:
            raise UsageError(
                f"Launch of {kernel.name!r} mixes buffers of {sorted(devices)}; a kernel runs "
                f"on one device: add a Copy to bring the data over first"
            )
        for var in self.vars:
            if not isinstance(var, Var):
                raise UsageError(f"Launch vars must be Vars, got {var!r}")

    @property
    def device(self) -> str:
        """The device the launch runs on (its buffers' device)."""
        return self.bufs[0].device

    @property
    def label(self) -> str:
        return self.kernel.name

    def free_vars(self) -> frozenset[Var]:
        """The Vars whose values come from the call (not fixed by this launch).

        Returns:
            The Vars its kernel arguments and launch dimensions read, less the fixed ones.
        """
        if not self.vars and self.global_size is None and self.local_size is None:
            return _NO_VARS  # most launches: asked for each item of every compile
        used: frozenset[Var] = frozenset(self.vars)
        for dims in (self.global_size, self.local_size):
            for d in dims or ():
                used |= variables_of(d)
        return used - {var for var, _ in self.fixedvars}

    def with_buffers(self, bufs: Sequence[Buffer]) -> Launch:
        return attrs.evolve(self, bufs=tuple(bufs))

    def reads_writes(self) -> list[tuple[Buffer, bool]]:
        outs = self.kernel.outs  # a few slots: a tuple is searched faster than a set is made
        return [(buf, slot in outs) for slot, buf in enumerate(self.bufs)]


@attrs.frozen(eq=False)
class Copy:
    """Copy `src` into `dst`: on one device or across devices, an item of `rt.run` and
    `rt.compile`.

    Like memmove, `dst` and `src` may overlap (the bytes move as if through a temporary);
    an exact self-copy changes nothing. A copy runs on the destination device's copy
    queue.

    Args:
        dst: the Buffer written.
        src: the Buffer read, of the same dtype and size.

    Raises:
        UsageError: `dst` or `src` is no Buffer, or their dtypes or sizes differ.
    """

    dst: Buffer
    src: Buffer

    def __attrs_post_init__(self) -> None:
        for name in ("dst", "src"):
            if not isinstance(getattr(self, name), Buffer):
                raise UsageError(
                    f"Copy {name} must be an actorgraph Buffer, got {described(getattr(self, name))}"
                )
        if self.dst.dtype != self.src.dtype or self.dst.size != self.src.size:
            raise UsageError(
                f"Copy needs dst and src of the same dtype and size: dst is {self.dst!r}, "
                f"src is {self.src!r}; use views of matching size"
            )

    @property
    def device(self) -> str:
        """The destination's device, whose copy queue runs the copy."""
        return self.dst.device

    @property
    def bufs(self) -> tuple[Buffer, Buffer]:
        return (self.dst, self.src)

    @property
    def label(self) -> str:
        return f"copy {self.src.device}->{self.dst.device}"

    def free_vars(self) -> frozenset[Var]:
        return _NO_VARS

    def with_buffers(self, bufs: Sequence[Buffer]) -> Copy:
        return Copy(dst=bufs[0], src=bufs[1])

    def reads_writes(self) -> list[tuple[Buffer, bool]]:
        return [(self.dst, True), (self.src, False)]


Item = Union[Launch, Copy]
