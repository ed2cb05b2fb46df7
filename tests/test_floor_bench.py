"""benchmarks/floor.py runs, checks its results against numpy and writes its JSON (quick
sizes: it measures nothing here, the figures come from a full run)."""

from __future__ import annotations

import json
import pathlib

import numpy as np

from benchmarks import _workloads as wl
from benchmarks import floor


def test_the_alternating_chain_hands_every_step_to_the_other_device() -> None:
    chain = floor.alternating_chain(3)
    kinds = [(type(step).__name__, step.device) for step in chain.steps]
    assert kinds == [("Xor", 0), ("Move", 1), ("Xor", 1), ("Move", 0), ("Xor", 0), ("Move", 1)]
    # Each step reads the result of the one before it.
    for before, after in zip(chain.steps, chain.steps[1:]):
        reads = (after.a, after.b) if isinstance(after, wl.Xor) else (after.src,)
        assert before.out in reads


def test_the_floor_computes_what_numpy_does() -> None:
    workload = wl.two_device_copies(32, 8)
    arrays = floor.floor_arrays(workload)
    floor.run_floor(floor.floor_calls(workload, arrays))
    expect = wl.reference(workload, workload.host_inputs())
    for out in workload.outputs:
        np.testing.assert_array_equal(arrays[out], expect[out])


def test_quick_run_writes_every_row(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "floor.json"
    assert floor.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    for row in ("tiny", "copies", "small"):
        assert result[row]["ratio"] > 0 and result[row]["target_ratio"] == floor.TARGETS[row]
        assert result[row]["trio_pass_us"] > 0
    assert result["chain"]["steps"] == [4, 8]
    assert result["sync"]["items"] == 16
