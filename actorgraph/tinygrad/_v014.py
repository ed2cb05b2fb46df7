"""The adapter for tinygrad 0.14: a jit's captured LINEAR of CALLs, in actorgraph's terms.

tinygrad 0.14's jit captures a UOp `LINEAR` of `CALL`s (a compiled PROGRAM or a COPY
over buffer arguments; arguments that are the jit's inputs are PARAMs, or views of them:
SHRINK, BITCAST, MSELECT). At capture it splits the LINEAR into batches its devices'
graph class accepts (`supports_uop`), each a `CUSTOM_FUNCTION "graph"` call, and builds
a runner for a batch the first time it runs (`GraphRunner(linear, input_uops)`, kept
by tinygrad, with no fallback when building fails: a batch is refused in supports_uop
or never). The runner is then called as `(input_uops, var_vals by name, wait)`.

tinygrad 0.14's CPU devices have no graph class of their own: its jit calls their
kernels one by one, inline on the caller's thread. `ActorGraph` is theirs while
installed: a batch of compiled kernels and copies over any of the CPU devices
install() opened, replayed synchronously where tinygrad would have run it (see
_install), so program order orders it with tinygrad's inline kernels, copies and
synchronize().

A sharded tensor is a MultiBuffer: a call over one runs once per lane (device), with
`_device_num` the lane's number; each lane is a call of its own here, and each lane of
an input a root of its own.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import attrs
from tinygrad.device import Device, MultiBuffer
from tinygrad.engine.jit import MultiGraphRunner
from tinygrad.engine.realize import (
    get_call_arg_uops,
    get_runtime,
    resolve_params,
    run_linear,
    unwrap_multi,
)
from tinygrad.helpers import to_tuple
from tinygrad.tensor import Tensor
from tinygrad.uop.ops import Ops, UOp, buffers

from .._errors import ClosedError, InputError, UsageError
from .._vars import Var
from ._batch import Batch, on_runtime_thread
from ._check import TinyCall
from ._convert import (
    U8,
    Call,
    CopyCall,
    KernelCall,
    Layouts,
    Region,
    Root,
    Wrapper,
    check_arguments,
    check_live,
    cpu_kernel,
    device_name,
    jit_name,
    layout_key,
)
from ._install import Inline, current
from ._private import (
    buffer_address,
    buffer_base,
    buffer_memory,
    cpu_device_class,
    opened_devices,
    prepare_jit_inputs,
    register_device,
    written_inputs,
)

VERSION = "0.14.0"
ORDERING = Inline()


def _base_of(buf: Any) -> Any:
    base = buffer_base(buf)
    return buf if base is None else base


def _offset_of(buf: Any) -> int:
    return int(buf.offset) if buffer_base(buf) is not None else 0


def _device_refusal(name: str, ndevices: int | None, remote: int) -> str | None:
    """Why actorgraph cannot run a call on tinygrad device `name`, or None when it can:
    one of the first `ndevices` CPU devices (None: any), or of the `remote` AG devices."""
    kind, _, index = name.partition(":")
    if not (index == "" or index.isdigit()):
        return f"a call on {name} (actorgraph runs tinygrad's CPU and AG devices only)"
    if kind == "AG":
        if int(index or 0) >= remote:
            return (
                f"a call on {name}, past the {remote} worker devices actorgraph.tinygrad "
                f"opened (install(remote=[...]) naming more)"
            )
        return None
    if kind != "CPU":
        return f"a call on {name} (actorgraph runs tinygrad's CPU and AG devices only)"
    if ndevices is not None and int(index or 0) >= ndevices:
        return (
            f"a call on {name}, past the {ndevices} CPU devices actorgraph.tinygrad "
            f"opened (install(devices=N) with a larger N)"
        )
    return None


def _refusal(call: Any, ndevices: int | None, remote: int = 0) -> str | None:
    """Why actorgraph cannot run this CALL on its devices, or None when it can."""
    ast = call.src[0]
    if ast.op not in (Ops.PROGRAM, Ops.COPY):
        kind = ast.arg if ast.op is Ops.CUSTOM_FUNCTION else ast.op
        return f"a {kind} call (actorgraph runs compiled CPU kernels and copies only)"
    for arg in get_call_arg_uops(call):
        for name in to_tuple(arg.device):
            refusal = _device_refusal(str(name), ndevices, remote)
            if refusal is not None:
                return refusal
    if ast.op is Ops.PROGRAM:
        info = ast.arg
        if getattr(info.target, "renderer", None) == "LVP":
            return f"kernel {info.function_name} compiled for LVP (it takes its arguments packed)"
        if not isinstance(info.global_size[0], int):
            return f"kernel {info.function_name} with a symbolic core count"
    return None


@attrs.define
class Described:
    """A batch of CALLs read for actorgraph: calls over regions, the input roots (with
    where each comes from: input slot and lane, -1 for a plain buffer) and the vars."""

    calls: list[Call] = attrs.field(factory=list)
    roots: list[Root] = attrs.field(factory=list)
    sources: list[tuple[int, int]] = attrs.field(factory=list)
    variables: dict[str, Var] = attrs.field(factory=dict)
    programs: list[Any] = attrs.field(factory=list)


def stand_ins(inputs: Sequence[Any]) -> list[Any]:
    """A fresh buffer UOp like each input (never allocated), to read a jit's calls
    against. The jit's own record says which arguments are its inputs: a PARAM of an
    input slot (or a view of one) resolves to that slot's stand-in, and nothing else
    can, while a buffer the jit holds stays its own even when the very same buffer is
    what a call passes (its weight, its state)."""
    return [UOp.new_buffer(u.device, u.max_numel(), u.dtype) for u in inputs]


class _Reader:
    """Reads CALLs against stand-ins for a call's inputs (`inputs`: slot -> UOp, see
    stand_ins), which no call uses but through the jit's input slots."""

    def __init__(self, inputs: Sequence[Any], remote: Sequence[str] = ()) -> None:
        self.inputs = tuple(inputs)
        self.remote = tuple(remote)  # the worker devices of AG, AG:1, ...
        self.out = Described()
        # base Buffer (they hash by identity) -> [(slot, lane, lane Buffer)] of the
        # inputs' lanes.
        self._lanes: dict[Any, list[tuple[int, int, Any]]] = {}
        for slot, uop in enumerate(self.inputs):
            buf = uop.buffer
            lanes = buf.bufs if isinstance(buf, MultiBuffer) else [buf]
            for lane, lane_buf in enumerate(lanes):
                entry = (slot, lane if isinstance(buf, MultiBuffer) else -1, lane_buf)
                self._lanes.setdefault(_base_of(lane_buf), []).append(entry)
        self._root_of: dict[tuple[int, int], int] = {}
        self._kernels: dict[tuple[str, bytes], Any] = {}

    def _ready(self, buf: Any) -> Any:
        """`buf`, allocated as tinygrad's own call would, unless it lies in an input's
        stand-in (its memory is each call's input)."""
        return buf if _base_of(buf) in self._lanes else buf.ensure_allocated()

    def region(self, buf: Any, what: str, whole: bool = True) -> Region:
        """Where `buf` lies; `whole`: an argument that is a whole input covers all of it
        on every call (a copy moves a fixed number of bytes instead)."""
        device = device_name(buf.device, self.remote)
        start = _offset_of(buf)
        for slot, lane, lane_buf in self._lanes.get(_base_of(buf), ()):
            lane_start = _offset_of(lane_buf)
            if lane_start <= start and start + buf.nbytes <= lane_start + lane_buf.nbytes:
                root = self._root(slot, lane, lane_buf)
                if whole and start == lane_start and buf.nbytes == lane_buf.nbytes:
                    return Region(device, root, 0, -1)  # the whole input
                return Region(device, root, start - lane_start, buf.nbytes)
        base = _base_of(buf)
        if not base.is_allocated():
            raise InputError(
                f"{what}: tinygrad buffer {base!r} is not allocated (freed); capture the jit "
                f"again (jit.reset()) after freeing its memory"
            )
        if "@" in device:  # a worker's: its allocation, not a host address
            return Region(device, -1, start, buf.nbytes, 0, base.nbytes, buffer_memory(base))
        return Region(device, -1, start, buf.nbytes, buffer_address(base), base.nbytes)

    def _root(self, slot: int, lane: int, lane_buf: Any) -> int:
        found = self._root_of.get((slot, lane))
        if found is None:
            found = self._root_of[(slot, lane)] = len(self.out.roots)
            device = device_name(lane_buf.device, self.remote)
            self.out.roots.append(Root(device, lane_buf.nbytes, "@" in device))
            self.out.sources.append((slot, lane))
        return found

    def read(self, number: int, call: Any) -> None:
        refusal = _refusal(call, None, len(self.remote))
        if refusal is not None:
            raise UsageError(f"call {number} of the jit is {refusal}")
        ast = call.src[0]
        resolved = resolve_params(call, self.inputs)
        what = f"call {number}"
        if ast.op is Ops.COPY:
            for bufs, _ in unwrap_multi(call, resolved):
                dst, src = self._ready(bufs[0]), self._ready(bufs[1])
                dst_region = self.region(dst, what, whole=False)
                src_region = attrs.evolve(self.region(src, what, whole=False), nbytes=dst.nbytes)
                self.out.calls.append(CopyCall(dst_region, src_region))
            return
        info = ast.arg
        devices = to_tuple(call.src[1].device)
        lanes = unwrap_multi(call, [resolved[i] for i in info.globals])
        for device, (bufs, device_vars) in zip(devices, lanes):
            kernel = self._kernel(device, ast)
            regions = tuple(self.region(self._ready(b), what) for b in bufs)
            # Machine code on a worker is called once per core there: it needs the count.
            dims = (int(info.global_size[0]), 1, 1) if kernel.code is not None else None
            values: list[Var | int] = []
            for var in info.vars:
                name = var.expr
                if name in info.runtimevars:
                    continue  # the kernel's body passes it (see cpu_kernel)
                if name in device_vars:
                    values.append(int(device_vars[name]))
                else:
                    found = self.out.variables.get(name)
                    if found is None:
                        found = Var(name, int(var.vmin), int(var.vmax))
                        self.out.variables[name] = found
                    values.append(found)
            self.out.calls.append(KernelCall(kernel, regions, tuple(values), dims))

    def _kernel(self, device: str, ast: Any) -> Any:
        key = (device, ast.key)
        found = self._kernels.get(key)
        if found is not None:
            return found
        info = ast.arg
        program = get_runtime(device, ast)
        if str(device).split(":")[0] == "AG":
            found = self._shipped(program, info)
            self._kernels[key] = found
            self.out.programs.append(program)
            return found
        address = ctypes.cast(program.fxn, ctypes.c_void_p).value
        if not address:
            raise UsageError(f"kernel {info.function_name} has no loaded CPU function")
        globals_ = list(info.globals)
        core = info.runtimevars.get("core_id")
        found = cpu_kernel(
            info.function_name,
            address,
            len(globals_),
            len(info.vars),
            ctypes.c_uint64,
            [k for k, slot in enumerate(globals_) if slot in info.outs],
            [k for k, slot in enumerate(globals_) if slot in info.ins],
            keep=program,
            core_id=core,
            cores=int(info.global_size[0]),
        )
        if core is None and info.global_size[0] != 1:
            raise UsageError(
                f"kernel {info.function_name} runs {info.global_size[0]} times per call "
                f"without a core_id; actorgraph does not know what tells those calls apart"
            )
        self._kernels[key] = found
        self.out.programs.append(program)
        return found

    @staticmethod
    def _shipped(program: Any, info: Any) -> Any:
        """The kernel of a program compiled for a worker (an AGProgram): its machine
        code, with the buffers it writes and reads."""
        globals_ = list(info.globals)
        return program.kernel(
            len(globals_),
            len(info.vars),
            tuple(k for k, slot in enumerate(globals_) if slot in info.outs),
            tuple(k for k, slot in enumerate(globals_) if slot in info.ins),
        )


def _on_ag(call: Any) -> bool:
    return any(
        str(name).startswith("AG")
        for arg in get_call_arg_uops(call)
        for name in to_tuple(arg.device)
    )


def flatten(linear: Any) -> list[Any]:
    """The CALLs of a LINEAR, with tinygrad's graph batches opened up."""
    calls = []
    for call in linear.src:
        ast = call.src[0]
        if ast.op is Ops.CUSTOM_FUNCTION and ast.arg == "graph":
            calls.extend(ast.src[0].src)
        else:
            calls.append(call)
    return calls


def describe(calls: Sequence[Any], inputs: Sequence[Any], remote: Sequence[str] = ()) -> Described:
    """`calls` read against stand-ins for `inputs` (a call's input UOps): see stand_ins;
    `remote`: the worker devices of AG, AG:1, ..."""
    reader = _Reader(stand_ins(inputs), remote)
    for number, call in enumerate(calls):
        reader.read(number, call)
    return reader.out


def places(sources: Sequence[tuple[int, int]], inputs: Sequence[Any]) -> list[tuple[int, int]]:
    """(address, nbytes) of each root for this call's input UOps."""
    out = []
    for slot, lane in sources:
        uop = inputs[slot]
        buf = buffers.get(uop)  # an input is a buffer UOp: its Buffer, without .buffer's walk
        if buf is None:
            buf = uop.buffer
        if lane >= 0:
            buf = buf.bufs[lane]
        if not buf.is_allocated():
            raise InputError(
                f"jit input {slot}: its tinygrad buffer {buf!r} was freed; pass a realized tensor"
            )
        out.append((buffer_address(buf), buf.nbytes))
    return out


def mixed_places(
    sources: Sequence[tuple[int, int]], inputs: Sequence[Any]
) -> list[tuple[Any, int]]:
    """`places` for a batch on AG devices too: (its AGMemory, nbytes) for a root on one."""
    out = []
    for slot, lane in sources:
        buf = inputs[slot].buffer
        if lane >= 0:
            buf = buf.bufs[lane]
        if not buf.is_allocated():
            raise InputError(
                f"jit input {slot}: its tinygrad buffer {buf!r} was freed; pass a realized tensor"
            )
        remote = buf.device.startswith("AG")
        out.append((buffer_memory(buf) if remote else buffer_address(buf), buf.nbytes))
    return out


def batch_of(described: Described, wrapper: Wrapper, keep: Any) -> Batch:
    return Batch(
        described.calls,
        described.roots,
        described.variables,
        wrapper,
        sizes_known=True,
        keep=(keep, described.programs),
    )


class ActorGraph(MultiGraphRunner):  # type: ignore[misc]
    """tinygrad's graph runner for its CPU and AG devices, replaying through actorgraph
    (named like tinygrad's own graph classes, which tools recognise by the name).

    Takes compiled kernels and copies between any of the CPU devices install() opened
    and its AG devices (the workers'), in one batch: a data-parallel step over local
    devices and workers is one graph. A batch on CPU devices alone replays on the
    caller's thread; one on AG devices goes with their recorded work (one batch per
    worker), and the caller waits for it only when it touches CPU devices too.
    """

    def __init__(self, linear: Any, input_uops: tuple[Any, ...] = ()) -> None:
        state = current()
        if state is None:
            raise ClosedError(
                "actorgraph.tinygrad was uninstalled after this jit captured; capture it "
                "again (jit.reset()) or install() first"
            )
        super().__init__(linear, input_uops)
        self._state = state
        described = describe(self.linear.src, input_uops, remote=state.remote)
        self._sources = described.sources
        self._batch = batch_of(described, state.wrapper, self.linear)
        self._places = mixed_places if self._batch.remote else places
        self._tiny_devices = sorted({b.device for _, _, bufs, _ in self.calls for b in bufs})
        state.graph_made()

    @staticmethod
    def supports_uop(batch_devs: list[Any], new_call: Any) -> bool:
        state = current()
        if state is None:
            return False
        kinds: tuple[type, ...] = (cpu_device_class(),)
        if state.remote:
            from ._ag import AGDevice

            kinds = (*kinds, AGDevice)
        if not all(isinstance(d, kinds) for d in batch_devs):
            return False
        return _refusal(new_call, state.ndevices, len(state.remote)) is None

    def __call__(
        self, input_uops: tuple[Any, ...], var_vals: dict[str, int], wait: bool = False
    ) -> float | None:
        # input_uops: tinygrad's tuple for this jit call, the same for each of its batches.
        return self._state.replay(
            self._batch,
            self._places(self._sources, input_uops),
            var_vals,
            self._tiny_devices,
            wait,
            input_uops,
        )


class Reference:
    """One replay's batch as tinygrad 0.14 runs it, for install(check_replays=N): each
    CALL resolved against the replay's input UOps as its own `exec_kernel` and
    `exec_copy` resolve it, one lane per device."""

    def __init__(self, calls: Sequence[Any], input_uops: Sequence[Any], var_vals: Any) -> None:
        self._var_vals = dict(var_vals)
        self._lanes: list[tuple[TinyCall, Any, dict[str, int]]] = []
        inputs = tuple(input_uops)
        for number, call in enumerate(calls):
            ast = call.src[0]
            if ast.op is Ops.COPY:
                name, outs = "copy", (0,)
            else:
                name, outs = ast.arg.function_name, tuple(ast.arg.outs)
            for bufs, device_vars in unwrap_multi(call, resolve_params(call, inputs)):
                lane = [b.ensure_allocated() for b in bufs]
                self._lanes.append((TinyCall(number, name, lane, outs), call, device_vars))

    def calls(self) -> list[TinyCall]:
        return [tiny for tiny, _, _ in self._lanes]

    def run(self, shadow: Any) -> None:
        """tinygrad's run_linear over each lane's CALL with its buffers swapped for
        their shadows (CPU devices run it inline: done when it returns)."""
        for tiny, call, device_vars in self._lanes:
            bufs = iter(tiny.bufs)
            args = [
                s if s.is_bound_var else UOp.from_buffer(shadow(next(bufs))) for s in call.src[1:]
            ]
            linear = UOp(Ops.LINEAR, src=(call.replace(src=(call.src[0], *args)),))
            run_linear(linear, {**self._var_vals, **device_vars}, update_stats=False, jit=True)


class CheckedActorGraph(ActorGraph):
    """The runner while install(check_replays=N) is on: a replay also hands install() the
    batch as tinygrad runs it, for the check."""

    def __call__(
        self, input_uops: tuple[Any, ...], var_vals: dict[str, int], wait: bool = False
    ) -> float | None:
        calls = self.linear.src
        return self._state.replay_checked(
            self._batch,
            places(self._sources, input_uops),
            var_vals,
            self._tiny_devices,
            wait,
            lambda: Reference(calls, input_uops, var_vals),
        )


def synchronize(name: str) -> None:
    Device[name].synchronize()


def _tensor_buffers(value: Any) -> list[Any]:
    """The tinygrad Buffers (lanes of a sharded tensor each) behind a tensor argument,
    where they exist."""
    uop = value.uop
    if uop.op is Ops.UNSHARD:
        uop = uop.src[0]
    found = buffers.get(uop.base)
    if found is None:
        return []
    return list(found.bufs) if isinstance(found, MultiBuffer) else [found]


class JitSource:
    """A captured TinyJit as the trio path reads it: its calls, and per call its roots
    from the jit's own arguments, checked as TinyJit checks them."""

    def __init__(self, jit: Any, wrapper: Wrapper) -> None:
        self.name = jit_name(jit)
        captured = getattr(jit, "captured", None)
        if captured is None:
            raise UsageError(
                f"{self.name} has not captured its work yet; call it twice first (tinygrad's "
                f"TinyJit captures on its second call)"
            )
        self._captured = captured
        self._calls = flatten(captured.linear)
        # AG devices are the workers' of install(), and their memory lives in its runtime.
        self._state = current()
        self._remote = () if self._state is None else self._state.remote
        for number, call in enumerate(self._calls):
            refusal = _refusal(call, None, len(self._remote))
            if refusal is not None:
                raise UsageError(f"call {number} of {self.name} is {refusal}")
        if self._remote and any(_on_ag(call) for call in self._calls):
            assert self._state is not None
            if wrapper.runtime is not self._state.runtime:
                raise UsageError(
                    f"{self.name} runs on AG devices, whose memory lives in the runtime "
                    f"install() started; pass that runtime: graph_from_jit(agt.runtime(), jit)"
                )
        self._written = written_inputs(captured)
        self._wrapper = wrapper
        self.size = len(self._calls)
        self.ret = captured.ret
        self.batch: Batch | None = None
        self._sources: list[tuple[int, int]] = []
        self._scratch: dict[int, Any] = {}  # root -> where an input the jit writes is copied
        self._layouts = Layouts()

    def _layout_of(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, int], tuple[Any, ...]] | None:
        """(input buffer UOps, var values, layout) as TinyJit's check would give them
        for a call whose tensor arguments are realized, each on one device; None for any
        other call (tinygrad's own check handles those)."""
        if kwargs:
            return None
        inputs: list[Any] = []
        var_vals: dict[str, int] = {}
        keys: list[Any] = []
        for value in args:
            if value.__class__ is Tensor:
                uop = value.uop
                base = uop.base
                if base.op is not Ops.BUFFER:
                    return None
                buf = buffers.get(base)
                if buf is None or isinstance(buf, MultiBuffer) or not buf.is_allocated():
                    return None
                key = layout_key(uop, base, (base.dtype, base.device, base.src))
                if key is None:
                    return None
                inputs.append(base)
                keys.append(key)
            elif isinstance(value, UOp):
                if not value.is_bound_var:
                    return None
                var, bound = value.unbind()
                var_vals[var.expr] = bound
            elif isinstance(value, (tuple, list, dict)):
                return None  # tinygrad takes tensors from containers too
        if len(set(inputs)) != len(inputs):
            return None  # tinygrad refuses it: let its check say so
        return inputs, var_vals, tuple(keys)

    def _check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        found = self._layout_of(args, kwargs)
        known = self._layouts.answer(found)
        if known is not None:
            return known
        named = [*enumerate(args), *sorted(kwargs.items())]
        check_live(
            self.name,
            ((n, buf) for n, v in named if isinstance(v, Tensor) for buf in _tensor_buffers(v)),
        )
        inputs, var_vals, names, info = prepare_jit_inputs(args, kwargs)
        captured = self._captured
        check_arguments(
            self.name, names, captured.expected_names, info, captured.expected_input_info
        )
        self._layouts.accept(found, var_vals)
        return inputs, var_vals

    async def prepare(
        self, runtime: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Batch, list[Any], dict[str, int]]:
        inputs, var_vals = self._check(args, kwargs)
        batch = self.batch
        if batch is None or batch.stale():
            # First replay, or tinygrad let go of memory the jit held: read it (again).
            batch = self._read_calls(inputs)
        # Inputs that are memory the jit writes (its output passed back in, say) are
        # copied first, as TinyJit copies them, so they are roots like any input.
        written = [k for k, (slot, _) in enumerate(self._sources) if inputs[slot] in self._written]
        if batch.remote:  # the workers' memory is resolved on the runtime's thread
            partial = batch.wrap_local_roots(mixed_places(self._sources, inputs))
            roots = await on_runtime_thread(runtime, batch.resolve_roots, partial)
        else:
            roots = batch.wrap_roots(places(self._sources, inputs))
        for k in written:
            scratch = self._scratch.get(k)
            if scratch is None or scratch.nbytes != roots[k].nbytes:
                if scratch is not None:
                    runtime.free(scratch)
                scratch = self._scratch[k] = runtime.alloc(roots[k].device, roots[k].nbytes, U8)
            await runtime.copy(scratch, roots[k])  # as TinyJit copies it, before the replay
            roots[k] = scratch
        return batch, roots, var_vals

    def _read_calls(self, inputs: list[Any]) -> Batch:
        """The batch of the jit's calls, read against stand-ins for a call's `inputs`
        (see describe: the jit's own record says which memory is an input), kept as the
        jit's batch."""
        described = describe(self._calls, inputs, remote=self._remote)
        self._sources = described.sources
        self.batch = batch_of(described, self._wrapper, self._captured)
        return self.batch

    def points(self, batch: Batch) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        if batch.remote and self._state is not None:
            # The AG work tinygrad recorded before goes first (the replay is a call on
            # the same runtime after it).
            self._state.pending.flush()
        return (), ()  # tinygrad ran its earlier CPU work inline: nothing is pending


def register_remote(state: Any) -> Any:
    """Register tinygrad's AG devices (the workers' devices install() opened), once each
    worker is known to run them; return the function that undoes it."""
    from ._ag import AGDevice, check_worker, release_cached

    for name in state.remote:
        check_worker(name, state.worker_cpu(name))
    restore = register_device("AG", AGDevice)

    def unregister() -> None:
        release_cached(opened_devices())  # their frees go with the last flush
        restore()

    return unregister
