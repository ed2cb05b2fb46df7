"""Simulated links that copies share, on trio's clock.

A copy between two SIM GPUs crosses the links of its route (devices/_topology.py). While
several copies cross one link, they share its bandwidth: each copy moves at a max-min
fair rate (progressive filling: raise every copy's rate together until a link is full,
fix the rates of the copies on that link, and go on with the others), which never puts
more bytes through a link than it carries and leaves no link idle that a copy could
still use. A copy's end therefore moves whenever another copy starts or ends on a link
it shares; each copy waits for its own end and is woken only when that end moves.

One `SharedLinks` serves all SIM devices of a runtime (the runtime joins them), so
copies on different devices' queues see each other. Time is trio's: under
`MockClock(autojump_threshold=0)` the sharing is exact and deterministic, since rates
depend only on which copies are in flight, never on the order tasks ran in.
"""

from __future__ import annotations

import math

import attrs
import trio

from ._topology import Link, Route


@attrs.frozen
class LinkStatistics:
    """A snapshot of a runtime's shared links."""

    copies: int  # copies that went through them
    contended: int  # of those, the ones that shared a link with another copy for a while
    in_flight: int  # copies moving now
    busy_links: int  # links some copy is crossing now


class _Flow:
    """One copy in flight: bytes left as of `at`, its rate since then, and when it ends
    at that rate."""

    __slots__ = ("at", "cap", "changed", "end", "left", "links", "rate", "total")

    def __init__(self, route: Route, nbytes: float, now: float) -> None:
        self.links = route.links
        self.cap = route.bandwidth  # the most it moves at, alone on its route
        self.total = self.left = float(nbytes)
        self.at = now
        self.rate = 0.0
        self.end = math.inf
        self.changed = trio.Event()

    def moved_until(self, now: float) -> None:
        """Count the bytes it moved since `at`, at its rate, as of `now`."""
        self.left = max(0.0, self.left - self.rate * (now - self.at))
        self.at = now

    def runs_at(self, rate: float, now: float) -> None:
        """It moves at `rate` from `now` (its bytes counted to now): wake its task if that
        moves its end."""
        self.rate = rate
        # Copies that end at one instant leave one after the other, in whatever order
        # their tasks run: what rounding leaves of one (a billionth of its bytes at
        # most) must not make it end a hair after the others in one order only.
        if self.left <= self.total * 1e-9:
            self.left = 0.0
        end = now + self.left / rate
        if end != self.end:
            self.end = end
            self.changed.set()
            self.changed = trio.Event()


class SharedLinks:
    """The shared links of one runtime's simulated machine and the copies crossing them.

    Invariants: every flow in flight is listed under each link it crosses in `_on`, has
    a rate > 0 and ends at `at + left / rate`. A copy starting or ending changes the
    rates of the flows that share links with it, directly or through other flows (its
    component), and of no other: only those are settled again.
    """

    def __init__(self) -> None:
        self._on: dict[Link, list[_Flow]] = {}
        self._copies = 0  # copies that crossed shared links
        self._contended = 0  # of them, those that shared a link with another for a while

    def statistics(self) -> LinkStatistics:
        """Copies that crossed these links, how many of them shared one for a while, and
        how many are moving now."""
        moving = len({flow for flows in self._on.values() for flow in flows})
        return LinkStatistics(self._copies, self._contended, moving, len(self._on))

    async def transfer(self, route: Route, nbytes: int, start: float) -> float:
        """Move `nbytes` along `route`, starting at simulated time `start` (not before
        now): the route's latency, then the bytes at the copy's share of its links.
        Returns the simulated time it ends, which is trio's time when it returns."""
        await trio.sleep_until(start + route.latency)
        self._copies += 1
        if nbytes <= 0 or not route.links:
            await trio.sleep_until(trio.current_time() + nbytes / route.bandwidth)
            return trio.current_time()
        flow = _Flow(route, nbytes, trio.current_time())
        contended = False
        for link in flow.links:
            on = self._on.setdefault(link, [])
            contended = contended or bool(on)
            on.append(flow)
        self._settle([flow])
        try:
            while flow.end > trio.current_time():
                contended = contended or any(len(self._on[link]) > 1 for link in flow.links)
                with trio.move_on_at(flow.end):
                    await flow.changed.wait()
        finally:
            neighbours = []
            for link in flow.links:
                on = self._on[link]
                on.remove(flow)
                if on:
                    neighbours.extend(on)
                else:
                    del self._on[link]
            if neighbours:
                self._settle(neighbours)
        if contended:
            self._contended += 1
        return trio.current_time()

    def _component(self, seeds: list[_Flow]) -> list[_Flow]:
        """The flows that share links with `seeds`, directly or through each other."""
        seen: set[_Flow] = set()  # flows compare by identity
        out = []
        for flow in seeds:  # a flow on several of the seeds' links comes once
            if flow not in seen:
                seen.add(flow)
                out.append(flow)
        todo = list(out)
        while todo:
            flow = todo.pop()
            for link in flow.links:
                for other in self._on.get(link, ()):
                    if other not in seen:
                        seen.add(other)
                        out.append(other)
                        todo.append(other)
        return out

    def _settle(self, seeds: list[_Flow]) -> None:
        """Count the bytes the flows of the seeds' component moved until now, give them
        their new fair rates, and wake those whose end moved."""
        now = trio.current_time()
        flows = self._component(seeds)
        for flow in flows:
            flow.moved_until(now)
        for flow, rate in zip(flows, fair_rates(flows)):
            flow.runs_at(rate, now)


def fair_rates(flows: list[_Flow]) -> list[float]:
    """Max-min fair rates by progressive filling: the link (or a flow's own cap) that
    fills first fixes the rates of its flows; repeat with what is left on the others."""
    rates = [0.0] * len(flows)
    open_flows = set(range(len(flows)))
    room: dict[Link, float] = {}
    users: dict[Link, list[int]] = {}
    for i, flow in enumerate(flows):
        for link in flow.links:
            room[link] = link.bandwidth
            users.setdefault(link, []).append(i)
    # Links by name, so that ties fall the same way whatever order the flows came in.
    links = sorted(users, key=lambda lk: lk.name)
    while open_flows:
        share, fixed = _tightest(flows, open_flows, links, room, users)
        # A share of 0 can only come of rounding on a full link: keep every rate > 0.
        share = max(share, 1.0)
        for i in fixed:
            rates[i] = share
            open_flows.discard(i)
            for link in flows[i].links:
                room[link] = max(0.0, room[link] - share)
    return rates


def _tightest(
    flows: list[_Flow],
    open_flows: set[int],
    links: list[Link],
    room: dict[Link, float],
    users: dict[Link, list[int]],
) -> tuple[float, list[int]]:
    """The tightest constraint on the open flows: a link's room split among its open
    flows, or a flow's own cap; the share it leaves each, and the flows it fixes."""
    share = math.inf
    tight: Link | None = None
    for link in links:
        count = sum(1 for i in users[link] if i in open_flows)
        if count and room[link] / count < share:
            share = room[link] / count
            tight = link
    lowest_cap = min(flows[i].cap for i in open_flows)
    if lowest_cap <= share:
        return lowest_cap, [i for i in open_flows if flows[i].cap == lowest_cap]
    return share, [i for i in users[tight] if i in open_flows] if tight is not None else []


class Transfer:
    """A copy between two SIM GPUs as its op carries it: its bytes, its route and the
    links it shares them on."""

    __slots__ = ("links", "nbytes", "route")

    def __init__(self, links: SharedLinks, route: Route, nbytes: int) -> None:
        self.links = links
        self.route = route
        self.nbytes = nbytes

    async def run(self, start: float) -> float:
        """Move the bytes from simulated time `start`; return when they have arrived."""
        return await self.links.transfer(self.route, self.nbytes, start)

    def link_seconds(self) -> list[tuple[str, float]]:
        """How long the copy holds each link of its route, moving at the link's full speed:
        the work it puts on each link, for lower bounds."""
        return [(link.name, self.nbytes / link.bandwidth) for link in self.route.links]
