"""One captured batch of tinygrad work and its plan, shared by install() and the trio path.

A batch is calls over its input roots and the jit's own memory (see _convert). It is
planned once for the largest root sizes it may see (`rt.compile(..., max_sizes=...)`):
a plan that treats each root as holding its maximum orders every smaller call soundly
(items touch fixed offsets of a root; only how far they reach changes, and the plan
already assumes the farthest), so symbolic shapes replay without planning again.

The maximum comes from the adapter when tinygrad says it (`Root.nbytes` of a root whose
size is fixed, a symbolic input's largest shape); where it cannot be known (tinygrad
0.11 hands a graph runner only the capture's buffers), a call with a larger root plans
once more, for at least twice the old maximum, so sizes that keep growing plan a
logarithmic number of times and a cycle of sizes plans once per new high.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from .._background import BackgroundRuntime
from .._buffer import Buffer
from .._errors import InputError
from .._kernel import Item
from .._runtime import Runtime
from .._vars import Var
from ._convert import (
    U8,
    Call,
    KernelCall,
    Key,
    Root,
    Wrapper,
    build_items,
    held_lookup,
    placeholder,
    regions_of,
)

T = TypeVar("T")

# The chains (a batch and the ones after it in a jit call, planned as one graph) kept per
# batch: a jit call cut into parts makes one; a few more cover calls that stop early.
_CHAINS_KEPT = 4
# A chain's batches after the first, and for each root of the chain (the first batch's,
# then each next one's) the index of its buffer among the graph's inputs.
ChainKey = tuple[tuple["Batch", ...], tuple[int, ...]]


class Batch:
    """The calls of one captured batch, its roots, its variables, and its newest plan.

    Invariant: `graph` (when set) was planned with every root i holding at most
    `limits[i]` bytes, so it serves any call whose roots fit those limits.

    Threads: the Wrapper's parts (wrapping this host's memory, `hold`, `stale`) run
    where the Wrapper is used (install()'s lock, or the trio program's thread); a batch
    on workers' devices is planned and its worker memory resolved on the runtime's
    thread, where that memory is allocated (`resolve_roots`, `plan` with its `runtime`).
    """

    def __init__(
        self,
        calls: Sequence[Call],
        roots: Sequence[Root],
        variables: Mapping[str, Var],
        wrapper: Wrapper,
        *,
        sizes_known: bool,
        keep: Any = None,
    ) -> None:
        self.calls = tuple(calls)
        self.roots = tuple(roots)
        self.variables = dict(variables)
        self.wrapper = wrapper
        # Whether Root.nbytes is each root's largest size (else: the capture's size).
        self.sizes_known = sizes_known
        self.keep = keep  # what the calls' code and memory belong to (tinygrad's objects)
        regions = [r for call in self.calls for r in regions_of(call) if r.root < 0]
        # The bases of this host's memory the jit holds: (device, address, nbytes), each once.
        self._held = {(r.device, r.address, r.base_nbytes) for r in regions if r.memory is None}
        # The allocations on workers (AG devices) it holds, each once, with how many
        # times tinygrad had let go of each when the jit was read (AGMemory.releases).
        memory = {id(r.memory): r.memory for r in regions if r.memory is not None}
        self._held_memory = tuple((m, m.releases) for m in memory.values())
        # The wrappers of this host's memory the newest plan uses, and whether tinygrad
        # let go of any (as of the Wrapper's count of such wrappers let go of, `_checked`).
        self._held_bufs: list[Buffer] = []
        self._checked = 0
        self._stale = False
        self.graph: Any = None
        self.limits: tuple[int, ...] = ()
        self.plans = 0
        # Worker memory standing in for inputs (see plan): the newest plan's, and the one
        # being made, which keep_plan makes the newest.
        self._placeholders: list[Buffer] = []
        self._planned: list[Buffer] = []
        names = self.devices
        # Whether it runs on workers' devices too (AG devices): then it is recorded with
        # their work, not run on this thread (_pending.py); and whether it touches this
        # host's CPU devices (tinygrad's own memory). Worked out once: a replay reads them.
        self.remote = any("@" in name for name in names)
        self.local = any("@" not in name for name in names)
        self.checked = 0  # replays checked (install(check_replays=N))
        # Plans of this batch followed by others of its jit call, as one graph (see
        # chain_for), by the batches that follow: the newest few.
        self._chains: dict[ChainKey, tuple[Any, tuple[int, ...]]] = {}

    def take_check(self, limit: int) -> int:
        """The number of this replay among the batch's checked ones (1, 2, ...), or 0
        when `limit` replays have been checked already."""
        if self.checked >= limit:
            return 0
        self.checked += 1
        return self.checked

    def describe(self) -> str:
        """The batch as a message names it: its size and first kernels."""
        names = [c.kernel.name if isinstance(c, KernelCall) else "copy" for c in self.calls]
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        return f"tinygrad batch of {len(names)} calls ({shown}) on {', '.join(self.devices)}"

    @property
    def devices(self) -> list[str]:
        names = {r.device for r in self.roots}
        for call in self.calls:
            names.update(r.device for r in regions_of(call))
        return sorted(names)

    def wrap_roots(self, places: Sequence[tuple[int, int]]) -> list[Buffer]:
        """This call's roots, as (address, nbytes) per root, wrapped: a batch in this
        host's memory only (else wrap_local_roots, then resolve_roots)."""
        wrap = self.wrapper.root
        return [
            wrap(root.device, address, nbytes)
            for root, (address, nbytes) in zip(self.roots, places)
        ]

    def wrap_local_roots(self, places: Sequence[tuple[Any, int]]) -> list[Any]:
        """`wrap_roots` for a batch on workers' devices too: a root on a worker, given as
        (its AGMemory, nbytes), stays its AGMemory until `resolve_roots`."""
        wrap = self.wrapper.root
        return [
            key if root.remote else wrap(root.device, key, nbytes)
            for root, (key, nbytes) in zip(self.roots, places)
        ]

    def resolve_roots(self, roots: Sequence[Any], runtime: Runtime) -> list[Buffer]:
        """The roots of wrap_local_roots, each on a worker made its Buffer on `runtime`
        (on the runtime's thread: that is where worker memory is allocated)."""
        return [key.buffer(runtime) if root.remote else key for root, key in zip(self.roots, roots)]

    def graph_for(self, roots: Sequence[Buffer]) -> Any:
        """The plan serving these roots, or None when they need a new one (plan())."""
        graph = self.graph
        return graph if graph is not None and _within(roots, self.limits) else None

    def hold(self) -> dict[Key, Buffer]:
        """The wrappers of this host's memory the jit holds, by (device, address, nbytes):
        what the next plan uses, and what `stale` watches (on the Wrapper's thread)."""
        held = {key: self.wrapper.held(*key) for key in self._held}
        self._held_bufs = list(held.values())
        return held

    def plan(
        self,
        roots: Sequence[Buffer],
        held: Mapping[Key, Buffer] | None = None,
        runtime: Runtime | None = None,
    ) -> tuple[list[Item], list[Buffer], list[int]]:
        """(items, inputs, limits) to compile: the items over `inputs`, which are these
        roots, and the root limits (max_sizes, in bytes); then keep_plan() the compiled
        graph. `held`: what `hold()` gave (None: hold() now); `runtime`: where a batch on
        workers' devices resolves their memory (on its thread; None for any other).

        A root in memory the jit holds itself (a call passing its weight or its state)
        would make the jit's own uses of that memory part of the input for every later
        call: such a root is planned as memory of its own instead (`placeholder`, or
        on a worker an allocation of its own), and the call with it aliases the jit's
        memory, which the graph plans for (aliasing="replan")."""
        limits = self._limits_for(roots)
        held = self.hold() if held is None else held
        inputs = list(roots)
        self._planned = []
        for k, given in enumerate(roots):
            if not self._held_overlaps(given, runtime):
                continue
            if runtime is not None and self.roots[k].remote:
                stand_in = runtime.alloc(given.device, limits[k], U8)
                self._planned.append(stand_in)
            else:
                stand_in = placeholder(runtime or self.wrapper.runtime, given.device, limits[k])
            inputs[k] = stand_in
        items = build_items(self.calls, inputs, held_lookup(held, runtime))
        return items, inputs, limits

    def joins_chains(self, roots: Sequence[Buffer], runtime: Runtime) -> bool:
        """Whether this batch over these roots can be a part of a graph planned with the
        batches of its jit call that follow it (`chain_part`): not where a root shares
        memory the jit holds, which only a plan of its own (`plan`) handles."""
        return not any(self._held_overlaps(given, runtime) for given in roots)

    def chain_part(
        self, roots: Sequence[Buffer], held: Mapping[Key, Buffer], runtime: Runtime
    ) -> tuple[list[Item], list[int]]:
        """(items, limits) of this batch over these roots, as a part of a chain's graph
        (`keep_chain`), where `joins_chains` says it can be."""
        return build_items(self.calls, roots, held_lookup(held, runtime)), self._limits_for(roots)

    def chain_for(self, key: ChainKey, inputs: Sequence[Buffer]) -> Any:
        """The plan of this batch and then others as one graph (`key`: those others, and
        which of the graph's inputs each root of the chain is), serving these inputs; or
        None when they need one (`chain_part`)."""
        kept = self._chains.get(key)
        return kept[0] if kept is not None and _within(inputs, kept[1]) else None

    def keep_chain(self, key: ChainKey, graph: Any, limits: Sequence[int]) -> None:
        """Keep `graph`, planned for `limits` (per input), as the plan of `key`'s chain;
        the oldest of more than a few goes."""
        chains = self._chains
        chains.pop(key, None)
        chains[key] = (graph, tuple(limits))
        while len(chains) > _CHAINS_KEPT:
            del chains[next(iter(chains))]

    def _limits_for(self, roots: Sequence[Buffer]) -> list[int]:
        limits = []
        for k, (buf, root) in enumerate(zip(roots, self.roots)):
            limit = max(buf.nbytes, root.nbytes)
            if self.limits and buf.nbytes > self.limits[k]:
                limit = max(limit, 2 * self.limits[k])  # grow geometrically (see above)
            elif self.limits:
                limit = max(limit, self.limits[k])
            if self.sizes_known and buf.nbytes > root.nbytes:
                raise InputError(
                    f"input {k} of this tinygrad batch holds {buf.nbytes} bytes but the jit "
                    f"was captured for at most {root.nbytes}; pass the inputs it was captured for"
                )
            limits.append(max(limit, 1))
        return limits

    def stale(self) -> bool:
        """Whether tinygrad let go of memory this batch's jit held since it was read (its
        allocation on a worker) or planned (this host's): `free_intermediates()`, a
        buffer deallocated. Its plan must never run again, and its calls must be read
        again from the jit."""
        freed = self.wrapper.held_freed
        if freed != self._checked:
            self._checked = freed
            self._stale = self._stale or any(buf.freed for buf in self._held_bufs)
        if self._held_memory and not self._stale:
            self._stale = any(m.releases != seen for m, seen in self._held_memory)
        return self._stale

    def _held_overlaps(self, root: Buffer, runtime: Runtime | None) -> bool:
        """Whether `root` shares bytes with memory the jit holds (its calls' regions
        outside the roots, each a base of the jit's, or an allocation on a worker)."""
        if "@" in root.device:
            assert runtime is not None  # a batch on workers is planned with its runtime
            return any(
                root.overlaps(m.buffer(runtime))
                for m, _ in self._held_memory
                if m.device == root.device
            )
        start, stop = root.byte_range
        for device, address, nbytes in self._held:
            if device == root.device and address < stop and start < address + nbytes:
                return True
        return False

    def keep_plan(
        self, graph: Any, limits: Sequence[int], runtime: Runtime | BackgroundRuntime | None = None
    ) -> None:
        """Make `graph` (planned for `limits`) the newest plan; the worker memory that
        stood in for inputs in the plan it replaces goes back to `runtime` once the work
        submitted before is done."""
        self.graph = graph
        self.limits = tuple(limits)
        self.plans += 1
        replaced, self._placeholders, self._planned = self._placeholders, self._planned, []
        for buf in replaced:
            if runtime is not None and not buf.freed:
                runtime.free(buf)

    def values(self, given: Mapping[Any, int], what: str) -> dict[Var, int]:
        """{Var: value} for this batch's variables, from tinygrad's values by name."""
        out: dict[Var, int] = {}
        for name, var in self.variables.items():
            value = given.get(name)
            if value is None:
                raise InputError(
                    f"{what} needs a value for tinygrad variable {name!r}; bind it in the "
                    f"call (Variable({name!r}, lo, hi).bind(value))"
                )
            out[var] = value
        return out


def _within(bufs: Sequence[Buffer], limits: Sequence[int]) -> bool:
    """Whether each buffer holds at most its limit: what a plan for those limits serves."""
    return all(buf.nbytes <= limit for buf, limit in zip(bufs, limits))


async def on_runtime_thread(runtime: BackgroundRuntime, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args, runtime.runtime)` on the background runtime's own thread, awaited from
    another (the trio path's): where a batch on workers' devices resolves their memory."""

    async def there() -> T:
        return fn(*args, runtime.runtime)

    result: T = await runtime.call(there)
    return result
