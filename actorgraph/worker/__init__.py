"""`actorgraph worker`: an application of the runtime that serves its devices to clients."""

from ._kernels import load_kernels as load_kernels
from ._listen import plaintext_problem as plaintext_problem
from ._server import Handshakes as Handshakes
from ._server import Worker as Worker
from ._server import run_worker as run_worker
from ._server import worker_main as worker_main

__all__ = [
    "Handshakes",
    "Worker",
    "load_kernels",
    "plaintext_problem",
    "run_worker",
    "worker_main",
]
