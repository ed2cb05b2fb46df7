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

from collections.abc import Mapping, Sequence
from typing import Any

from .._buffer import Buffer
from .._errors import InputError
from .._kernel import Item
from .._vars import Var
from ._convert import Call, KernelCall, Root, Wrapper, build_items, regions_of


class Batch:
    """The calls of one captured batch, its roots, its variables, and its newest plan.

    Invariant: `graph` (when set) was planned with every root i holding at most
    `limits[i]` bytes, so it serves any call whose roots fit those limits.
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
        # The bases of this host's memory the jit holds: (device, address, nbytes), each
        # once (a worker's, on an AG device, is its AGMemory, Region.memory).
        self._held = {
            (r.device, r.address, r.base_nbytes)
            for call in self.calls
            for r in regions_of(call)
            if r.root < 0 and r.memory is None
        }
        # The wrappers of that memory the newest plan uses, and whether tinygrad let go
        # of any (as of the Wrapper's count of such wrappers let go of, `_checked`).
        self._held_bufs: list[Buffer] = []
        self._checked = 0
        self._stale = False
        self.graph: Any = None
        self.limits: tuple[int, ...] = ()
        self.plans = 0
        names = self.devices
        # Whether it runs on workers' devices too (AG devices): then it is recorded with
        # their work, not run on this thread (_pending.py); and whether it touches this
        # host's CPU devices (tinygrad's own memory). Worked out once: a replay reads them.
        self.remote = any("@" in name for name in names)
        self.local = any("@" not in name for name in names)
        self.checked = 0  # replays checked (install(check_replays=N))

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

    def wrap_roots(self, places: Sequence[tuple[Any, int]]) -> list[Buffer]:
        """This call's roots, as (address, nbytes) per root, wrapped (a root on a
        worker's device: (its AGMemory, nbytes), its Buffer)."""
        wrap = self.wrapper.root
        runtime = self.wrapper.runtime
        return [
            key.buffer(runtime) if root.remote else wrap(root.device, key, nbytes)
            for root, (key, nbytes) in zip(self.roots, places)
        ]

    def graph_for(self, roots: Sequence[Buffer]) -> Any:
        """The plan serving these roots, or None when they need a new one (plan())."""
        graph = self.graph
        if graph is None:
            return None
        for buf, limit in zip(roots, self.limits):
            if buf.nbytes > limit:
                return None
        return graph

    def plan(self, roots: Sequence[Buffer]) -> tuple[list[Item], list[Buffer], list[int]]:
        """(items, inputs, limits) to compile: the items over `inputs`, which are these
        roots, and the root limits (max_sizes, in bytes); then keep() the compiled graph.

        A root in memory the jit holds itself (a call passing its weight or its state)
        would make the jit's own uses of that memory part of the input for every later
        call: such a root is planned as memory of its own instead (`Wrapper.placeholder`),
        and the call with it aliases the jit's memory, which the graph plans for
        (aliasing="replan")."""
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
        inputs = list(roots)
        for k, given in enumerate(roots):
            if self._held_overlaps(given):
                inputs[k] = self.wrapper.placeholder(given.device, limits[k])
        items = build_items(self.calls, inputs, self.wrapper)
        self._held_bufs = [self.wrapper.held(*key) for key in self._held]
        return items, inputs, limits

    def stale(self) -> bool:
        """Whether tinygrad let go of memory this batch's jit held since it was planned
        (`free_intermediates()`, a buffer deallocated): its plan must never run again,
        and its calls must be read again from the jit."""
        freed = self.wrapper.held_freed
        if freed != self._checked:
            self._checked = freed
            self._stale = self._stale or any(buf.freed for buf in self._held_bufs)
        return self._stale

    def _held_overlaps(self, root: Buffer) -> bool:
        """Whether `root` shares bytes with memory the jit holds (its calls' regions
        outside the roots, each a base of the jit's)."""
        start, stop = root.byte_range
        for device, address, nbytes in self._held:
            if device == root.device and address < stop and start < address + nbytes:
                return True
        return False

    def keep_plan(self, graph: Any, limits: Sequence[int]) -> None:
        self.graph = graph
        self.limits = tuple(limits)
        self.plans += 1

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
