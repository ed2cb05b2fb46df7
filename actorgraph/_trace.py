"""Profiles as Chrome trace-event JSON, the format Perfetto and chrome://tracing open.

Layout: one process per device, one thread (track) per queue actor; each item of each
replay is a complete ("X") slice named by its kernel or copy and its buffers; a parked
wait is a "wait" slice on the waiting actor; each cross-queue wait is a flow arrow from
the item waited for to the item that waited; a counter track counts replays in flight.
Timestamps are microseconds since the profile's first event. A worker's queues are timed
there and put on this host's clock: their slices say how far off they can be
(`clock_error_us`), and so does the trace's metadata, per actor.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ._log import logger
from ._profile import Profile, ProfileEvent, WaitKind

_COUNTER_PID = 0  # the runtime's own track (replays in flight)


def chrome_trace(profile: Profile) -> dict[str, Any]:
    """The trace as a dict, ready for `json.dump`."""
    origin = profile.start

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    devices: dict[str, int] = {}
    tracks: dict[str, tuple[int, int]] = {}
    trace: list[dict[str, Any]] = [
        _meta("process_name", _COUNTER_PID, None, "actorgraph"),
        _meta("process_sort_index", _COUNTER_PID, None, 0, key="sort_index"),
    ]
    for actor in profile.actors:
        device = actor.split("/")[0]
        if device not in devices:
            pid = devices[device] = len(devices) + 1
            trace.append(_meta("process_name", pid, None, device))
            trace.append(_meta("process_sort_index", pid, None, pid, key="sort_index"))
        pid = devices[device]
        tid = len(tracks) + 1
        tracks[actor] = (pid, tid)
        trace.append(_meta("thread_name", pid, tid, actor))
        trace.append(_meta("thread_sort_index", pid, tid, tid, key="sort_index"))

    by_item: dict[tuple[int, int, int], ProfileEvent] = {
        (e.graph, e.replay, e.item): e for e in profile.events
    }
    flow_id = 0
    for event in profile.events:
        pid, tid = tracks[event.actor]
        start = us(event.start)
        # Timed on a worker: how far off this host's clock its slices can be.
        clock_error = (
            {"clock_error_us": round(event.clock_error * 1e6, 3)} if event.clock_error else {}
        )
        trace.append(
            {
                "ph": "X",
                "cat": event.kind.value,
                "name": event.name,
                "pid": pid,
                "tid": tid,
                "ts": start,
                "dur": max(round(us(event.end) - start, 3), 0.001),
                "args": {
                    "item": event.item,
                    "label": event.label,
                    "graph": event.graph,
                    "replay": event.replay,
                    "buffers": list(event.buffers),
                    **clock_error,
                },
            }
        )
        for wait in event.waits:
            if wait.start is not None and wait.end is not None:
                wait_start = us(wait.start)
                trace.append(
                    {
                        "ph": "X",
                        "cat": "wait",
                        "name": f"wait {wait.on}",
                        "pid": pid,
                        "tid": tid,
                        "ts": wait_start,
                        "dur": max(round(us(wait.end) - wait_start, 3), 0.001),
                        "args": {
                            "for_item": wait.item,
                            "value": wait.value,
                            "kind": wait.kind.value,
                            **clock_error,
                        },
                    }
                )
            if wait.kind is not WaitKind.QUEUE or wait.item is None:
                continue
            source = by_item.get((event.graph, event.replay, wait.item))
            if source is None:
                continue
            flow_id += 1
            src_pid, src_tid = tracks[source.actor]
            # The arrow leaves from inside the source slice (its last instant) and binds to
            # the slice that encloses its end point ("bp": "e"): the waiting item.
            src_start, src_end = us(source.start), us(source.end)
            trace.append(
                {
                    "ph": "s",
                    "cat": "wait",
                    "name": "waits for",
                    "id": flow_id,
                    "pid": src_pid,
                    "tid": src_tid,
                    "ts": max(src_start, round(src_end - 0.0005, 4)),
                }
            )
            trace.append(
                {
                    "ph": "f",
                    "bp": "e",
                    "cat": "wait",
                    "name": "waits for",
                    "id": flow_id,
                    "pid": pid,
                    "tid": tid,
                    "ts": start,
                }
            )

    changes: list[tuple[float, int]] = []
    for span in profile.replays:
        changes.append((span.submitted, 1))
        changes.append((span.done, -1))
    in_flight = 0
    for when, delta in sorted(changes, key=lambda c: (c[0], -c[1])):
        in_flight += delta
        trace.append(
            {
                "ph": "C",
                "name": "replays in flight",
                "pid": _COUNTER_PID,
                "ts": us(when),
                "args": {"replays": in_flight},
            }
        )
    return {
        "traceEvents": trace,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "actorgraph",
            "replays": len(profile.replays),
            # Per actor timed on a worker: how far its times can be off this host's clock.
            "clock_error_us": {
                actor: round(error * 1e6, 3) for actor, error in profile.clock_errors().items()
            },
        },
    }


def _meta(name: str, pid: int, tid: int | None, value: Any, key: str = "name") -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "args": {key: value}}
    if tid is not None:
        event["tid"] = tid
    return event


def write_trace(profile: Profile, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Write `profile` as Chrome trace-event JSON (see Profile.to_chrome_trace).

    Args:
        profile: the Profile.
        path: the file to write.

    Returns:
        The trace, as a dict.
    """
    trace = chrome_trace(profile)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    logger.info("wrote a trace of %d items to %s", len(profile.events), os.fspath(path))
    return trace
