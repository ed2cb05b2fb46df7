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
from ._convert import Call, Root, Wrapper, build_items, regions_of


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
        self.graph: Any = None
        self.limits: tuple[int, ...] = ()
        self.plans = 0
        names = self.devices
        # Whether it runs on workers' devices too (AG devices): then it is recorded with
        # their work, not run on this thread (_pending.py); and whether it touches this
        # host's CPU devices (tinygrad's own memory). Worked out once: a replay reads them.
        self.remote = any("@" in name for name in names)
        self.local = any("@" not in name for name in names)

    @property
    def devices(self) -> list[str]:
        names = {r.device for r in self.roots}
        for call in self.calls:
            names.update(r.device for r in regions_of(call))
        return sorted(names)

    def wrap_roots(self, places: Sequence[tuple[Any, int]]) -> list[Buffer]:
        """This call's roots, as (address, nbytes) per root, wrapped (a root on a
        worker's device: (its AGMemory, nbytes), its Buffer)."""
        base = self.wrapper.base
        runtime = self.wrapper.runtime
        return [
            key.buffer(runtime) if root.remote else base(root.device, key, nbytes)
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

    def plan(self, roots: Sequence[Buffer]) -> tuple[list[Item], list[int]]:
        """Items over these roots and the root limits to compile them with (max_sizes,
        in bytes); then keep() the compiled graph."""
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
        return build_items(self.calls, roots, self.wrapper), limits

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
