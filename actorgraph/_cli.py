"""The `actorgraph` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _device_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one device, e.g. CPU:0,CPU:1")
    return names


def _tls_ca_argument(parser: argparse.ArgumentParser, scope: str) -> None:
    parser.add_argument(
        "--tls-ca",
        metavar="PATH",
        help=f"{scope}the CA that signed the --tls-cert of workers that speak TLS (or that "
        "certificate itself); default: the file ACTORGRAPH_TLS_CA names, if set",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="actorgraph",
        description="Replay captured device work across many devices with trio actors.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    demo = sub.add_parser(
        "demo",
        help="run a multi-device graph, print its plan, check it against eager",
        description="Build a graph over several devices, print its plan, replay it with "
        "fresh inputs and compare every replay with eager execution.",
    )
    demo.add_argument(
        "--devices",
        type=_device_list,
        default=["CPU:0", "CPU:1", "CPU:2"],
        help="comma-separated device names (default: CPU:0,CPU:1,CPU:2)",
    )
    demo.add_argument("--replays", type=int, default=10, help="replays to check (default: 10)")
    demo.add_argument(
        "--trace", metavar="PATH", help="profile the replays, write a Chrome trace (Perfetto) here"
    )
    demo.add_argument(
        "--plot",
        metavar="PATH",
        help="profile the replays, draw a timeline picture here (.png, .svg)",
    )
    demo.add_argument(
        "--token-file",
        metavar="PATH",
        help="the token file of the workers of remote devices (their --token-file; default: "
        "the file ACTORGRAPH_TOKEN_FILE names, if set)",
    )
    _tls_ca_argument(demo, "")
    demo.add_argument("-v", "--verbose", action="store_true", help="log what actorgraph does")

    worker = sub.add_parser(
        "worker",
        help="host devices for REMOTE clients (KIND:N@HOST:PORT device names)",
        description="Serve devices over TCP to actorgraph clients. Prints the address it "
        "listens on. Binds loopback unless --host says otherwise (then a token is required, "
        "and TLS unless --insecure-plaintext).",
    )
    worker.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    worker.add_argument("--port", type=int, default=7000, help="port (default: 7000; 0 picks one)")
    worker.add_argument(
        "--devices",
        type=_device_list,
        default=["CPU:0"],
        help="comma-separated devices to host (default: CPU:0)",
    )
    worker.add_argument(
        "--token-file",
        default=None,
        help="file holding the token shared by clients and the other workers of a runtime",
    )
    worker.add_argument(
        "--tls-cert",
        default=None,
        metavar="FILE",
        help="PEM certificate of this worker: every connection speaks TLS (clients pass "
        "open_runtime(..., remote_tls_ca=CA)), links to other workers too",
    )
    worker.add_argument(
        "--tls-key", default=None, metavar="FILE", help="PEM private key of --tls-cert"
    )
    worker.add_argument(
        "--insecure-plaintext",
        action="store_true",
        help="serve a --host other than loopback without TLS: anyone on the network path "
        "then reads the buffers and can take over a connection after its handshake (the "
        "token does not protect that); only on a network you trust",
    )
    worker.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say refused connections per address (still at most a line per address "
        "every 10 s), not only the latest of all",
    )
    worker.add_argument(
        "--tls-ca",
        default=None,
        metavar="FILE",
        help="CA the other workers' certificates are checked against on this worker's links "
        "to them (default: --tls-cert itself, for workers that share one certificate)",
    )
    worker.add_argument(
        "--kernels",
        action="append",
        default=[],
        metavar="MODULE",
        help="module whose KERNELS the clients may launch by name (repeatable); found on "
        "the Python path or in the current folder; the demo's kernels are always there",
    )
    worker.add_argument(
        "--max-frame", type=int, default=256 << 20, help="largest frame data part, bytes"
    )
    worker.add_argument(
        "--max-client-bytes", type=int, default=8 << 30, help="memory one client may allocate"
    )
    worker.add_argument(
        "--thread-bytes",
        type=int,
        default=None,
        metavar="B",
        help="CPU kernels touching at least B bytes (default 1 MiB) run on their client's "
        "thread; smaller ones run there until one run took under 100 us, then on the "
        "worker's event loop until a run takes longer; 0: every kernel on a thread",
    )
    worker.add_argument(
        "--max-pending-writes",
        type=int,
        default=1 << 30,
        help="bytes of host-write data one client may have sent and not yet used",
    )
    worker.add_argument(
        "--allow-programs",
        action="store_true",
        help="run the compiled CPU programs clients ship (tinygrad's AG device): any client "
        "holding the token may then run any machine code in this process; needs the "
        "tinygrad extra on this worker",
    )
    worker.add_argument(
        "--max-programs",
        type=int,
        default=4096,
        help="shipped programs one client may keep on this worker (default: 4096)",
    )
    worker.add_argument(
        "--max-program-bytes",
        type=int,
        default=256 << 20,
        help="bytes of shipped programs one client may keep on this worker (default: 256 MiB)",
    )
    worker.add_argument(
        "--max-handshakes",
        type=int,
        default=128,
        metavar="N",
        help="connections not yet authenticated held at once (at most a quarter of the "
        "file limit); the oldest is closed to make room (default 128)",
    )
    worker.add_argument(
        "--max-handshakes-per-address",
        type=int,
        default=32,
        metavar="N",
        help="connections not yet authenticated held at once from one address (default 32)",
    )

    bench = sub.add_parser(
        "bench",
        help="measure replay cost (the checkout's benchmarks/core.py, else a built-in one)",
        description="Run the core benchmarks (benchmarks/core.py, when running from a "
        "checkout) or, with --builtin or outside a checkout, a small built-in benchmark: "
        "tiny xor kernels on CPU:0 replayed as a Graph and as an @ag.jit function. "
        "Prints the figures and writes them as JSON.",
    )
    bench.add_argument(
        "--builtin", action="store_true", help="run the built-in benchmark even in a checkout"
    )
    bench.add_argument(
        "--items", type=int, default=256, help="built-in: kernels per replay (default: 256)"
    )
    bench.add_argument(
        "--replays", type=int, default=200, help="built-in: replays per round (default: 200)"
    )
    bench.add_argument(
        "--device",
        default="CPU:0",
        help="built-in: the device its kernels run on, a worker's too (KIND:N@HOST:PORT; "
        "default: CPU:0)",
    )
    bench.add_argument(
        "--token-file",
        metavar="PATH",
        help="built-in: the token file of the device's worker (its --token-file; default: "
        "the file ACTORGRAPH_TOKEN_FILE names, if set)",
    )
    _tls_ca_argument(bench, "built-in: ")
    bench.add_argument(
        "--out",
        metavar="PATH",
        help="write the figures as JSON here (default: benchmarks/core.py writes "
        "benchmarks/results/core.json; the built-in benchmark writes a file only with --out)",
    )

    devices = sub.add_parser(
        "devices",
        help="list the devices this machine offers (CPU, CUDA GPUs, SIM presets)",
        description="List what this machine offers: CPU devices, the GPUs the CUDA driver "
        "sees (none is fine: nothing is opened), and the SIM cost-model presets.",
    )
    devices.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def _bench(args: argparse.Namespace) -> int:
    from . import _bench as bench

    for flag, value in (("--items", args.items), ("--replays", args.replays)):
        if value < 1:
            print(f"actorgraph bench: {flag} must be >= 1, got {value}", file=sys.stderr)
            return 2
    script = None if args.builtin else bench.core_script()
    if script is None:
        return bench.main_builtin(
            args.items,
            args.replays,
            args.out,
            device=args.device,
            token_file=args.token_file,
            tls_ca=args.tls_ca,
        )
    given = (args.items, args.replays, args.device, args.token_file, args.tls_ca)
    if given != (256, 200, "CPU:0", None, None):
        print(
            "actorgraph bench: --items, --replays, --device, --token-file and --tls-ca apply "
            "to the built-in benchmark; add --builtin to use them",
            file=sys.stderr,
        )
        return 2
    print(f"running {script}")
    return bench.run_core(script, ["--out", args.out] if args.out else [])


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = action.choices.get(command)
            if isinstance(found, argparse.ArgumentParser):
                return found
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # Report an unknown flag with the usage of the command it was given to.
        _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    from actorgraph.scheduler import ActorGraphError

    try:
        return _run(args)
    except ActorGraphError as exc:
        # A bad device name, a worker that refuses, ...: say it plainly, no traceback.
        print(f"actorgraph {args.command}: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from ._demo import main as demo_main

        if args.replays < 1:
            print("actorgraph demo: --replays must be >= 1", file=sys.stderr)
            return 2
        if args.plot is not None:
            from ._errors import MissingExtraError
            from ._plot import require_matplotlib

            try:
                require_matplotlib()  # fail before the run, not after it
            except MissingExtraError as exc:
                print(f"actorgraph demo: {exc}", file=sys.stderr)
                return 2
        if args.verbose:
            import logging

            logging.basicConfig(format="%(name)s: %(message)s")
            logging.getLogger("actorgraph").setLevel(logging.DEBUG)  # ours only, not matplotlib's
        return demo_main(
            args.devices, args.replays, args.trace, args.plot, args.token_file, args.tls_ca
        )
    if args.command == "bench":
        return _bench(args)
    if args.command == "devices":
        from ._inventory import local_devices, render

        found = local_devices()
        print(json.dumps(found.as_json(), indent=2) if args.json else render(found))
        return 0
    if args.command == "worker":
        from actorgraph.devices.remote.wire import Limits
        from actorgraph.worker import Handshakes, worker_main

        try:
            handshakes = Handshakes(args.max_handshakes, args.max_handshakes_per_address)
        except ValueError as exc:
            print(f"actorgraph worker: {exc}", file=sys.stderr)
            return 2
        limits = Limits(
            max_tail=args.max_frame,
            max_session_bytes=args.max_client_bytes,
            max_pending_blob_bytes=args.max_pending_writes,
            max_code_count=args.max_programs,
            max_code_bytes=args.max_program_bytes,
        )
        return worker_main(
            args.devices,
            args.host,
            args.port,
            args.token_file,
            args.kernels,
            limits,
            args.thread_bytes,
            (args.tls_cert, args.tls_key, args.tls_ca),
            args.allow_programs,
            handshakes,
            args.insecure_plaintext,
            args.verbose,
        )
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
