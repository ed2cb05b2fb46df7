"""What a client's session and a link from another worker use of the worker that serves
them (`Host`; a `Worker`, _server.py, is one): its runtime, its kernels, its limits and
what it shares between its sessions. A Protocol, so that they need not import the server."""

from __future__ import annotations

from typing import Protocol

from actorgraph.devices import Resumer
from actorgraph.devices.remote import WorkerCPU
from actorgraph.devices.remote.wire import Limits

from .._kernel import Kernel
from .._runtime import Runtime
from ._peers import Peers
from ._placement import KernelTimes
from ._staging import StagingPool


class Host(Protocol):
    runtime: Runtime
    kernels: dict[str, Kernel]
    limits: Limits
    peers: Peers  # its links to other workers
    staging: StagingPool  # landing space of host writes
    times: KernelTimes  # what it has seen of kernels' run times
    resumer: Resumer  # runs held jobs on where their waits are met
    cpu: WorkerCPU  # what it runs on, and whether it runs shipped programs
