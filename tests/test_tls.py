"""TLS under REMOTE connections (actorgraph/devices/remote/tls.py): real workers started
with `--tls-cert`/`--tls-key`, clients with `remote_tls_ca=`, links between workers over
TLS; the refusals when one side does not speak it or the certificate is not trusted;
and a relay in the middle sees none of the data and can put nothing in.

The certificates are made here: a CA and a certificate for 127.0.0.1 signed by it
(trustme), and a second CA that signed nothing of the workers'.
"""

from __future__ import annotations

import re
import shlex
import shutil
import socket
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio
from _extras import importorskip
from _workers import GUARD, TOKEN, runtime, start
from actorgraph.devices import DeviceError
from actorgraph.devices.remote._sealed import READ, TLSSocket
from actorgraph.devices.remote._transport import RemoteConnectionError
from actorgraph.devices.remote.frames import encode
from actorgraph.devices.remote.tls import accept_tls, client_context, connect_tls, server_context
from actorgraph.devices.remote.wire import Limits

import actorgraph as ag
from actorgraph import testing as ag_testing
from actorgraph.testing import Worker
from actorgraph.worker import run_worker
from actorgraph.worker._peers import PeerRefusedError, Peers

sys.path.insert(0, str(Path(__file__).parent))
from remote_kernels import INC  # noqa: E402

trustme = importorskip("trustme")  # the TLS tests make their certificates with it


class Certificates:
    def __init__(self, folder: Path) -> None:
        ca = trustme.CA()
        self.ca = folder / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca))
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        self.cert = folder / "cert.pem"
        self.key = folder / "key.pem"
        leaf.private_key_pem.write_to_path(str(self.key))
        for pem in leaf.cert_chain_pems:
            pem.write_to_path(str(self.cert), append=True)
        elsewhere = ca.issue_cert("elsewhere.example")
        self.elsewhere_cert = folder / "elsewhere.pem"
        self.elsewhere_key = folder / "elsewhere-key.pem"
        elsewhere.cert_chain_pems[0].write_to_path(str(self.elsewhere_cert))
        elsewhere.private_key_pem.write_to_path(str(self.elsewhere_key))
        self.other_ca = folder / "other-ca.pem"
        trustme.CA().cert_pem.write_to_path(str(self.other_ca))

    def worker_args(self) -> list[str]:
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_workers(certs: Certificates) -> Iterator[tuple[Worker, Worker]]:
    """Two TLS workers sharing one certificate: A with CPU:0 and CPU:1, B with CPU:0."""
    a = start("CPU:0,CPU:1", extra_args=certs.worker_args())
    b = start("CPU:0", extra_args=certs.worker_args())
    yield a, b
    a.kill()
    b.kill()


async def test_data_goes_over_tls_between_clients_and_workers(
    certs: Certificates, tls_workers: tuple[Worker, Worker]
) -> None:
    # Copies in and out, a kernel, and copies between the two workers (over their own
    # TLS link: a TLS worker refuses a plain one) all give the right bytes.
    a, b = tls_workers
    ra, ra1, rb = a.name("CPU:0"), a.name("CPU:1"), b.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([ra, ra1, rb], remote_tls_ca=certs.ca) as rt:
            assert all(rt.device(name).connection.statistics().tls for name in (ra, rb))
            x = rt.alloc(ra, 1 << 16, np.int32)
            y = rt.alloc(rb, 1 << 16, np.int32)
            data = np.arange(1 << 16, dtype=np.int32)
            await rt.copyin(x, data)
            graph = await rt.compile(
                [ag.Launch(INC, [x, x]), ag.Copy(dst=y, src=x), ag.Launch(INC, [y, y])]
            )
            for n in range(1, 3):
                await graph()
                np.testing.assert_array_equal(await rt.copyout(y), data + n + 1)
            np.testing.assert_array_equal(await rt.copyout(x), data + 2)
            await rt.run([ag.Copy(dst=x, src=y)])
            np.testing.assert_array_equal(await rt.copyout(x), data + 3)


async def test_a_client_that_does_not_trust_the_certificate_refuses_the_worker(
    certs: Certificates, tls_workers: tuple[Worker, Worker]
) -> None:
    a, _ = tls_workers
    with trio.fail_after(GUARD):
        with pytest.raises(
            RemoteConnectionError,
            match=re.escape(f"cannot connect to the worker at 127.0.0.1:{a.port}: ")
            + r"the worker's certificate was refused \(.+\); give remote_tls_ca= the CA that "
            r"signed the worker's --tls-cert, and a certificate that names the host connected to",
        ):
            async with runtime([a.name("CPU:0")], remote_tls_ca=certs.other_ca):
                pass
        # A certificate the CA signed for another host is refused as well.
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(
                lambda task_status: run_worker(
                    ["CPU:0"],
                    token=TOKEN,
                    tls_cert=certs.elsewhere_cert,
                    tls_key=certs.elsewhere_key,
                    task_status=task_status,
                )
            )
            with pytest.raises(
                RemoteConnectionError,
                match=r"the worker's certificate was refused \(IP address mismatch, certificate "
                r"is not valid for '127.0.0.1'.\)",
            ):
                async with runtime([f"CPU:0@{host}:{port}"], remote_tls_ca=certs.ca):
                    pass
            nursery.cancel_scope.cancel()


async def test_a_plain_client_at_a_tls_worker_is_told_to_use_tls(
    tls_workers: tuple[Worker, Worker],
) -> None:
    a, _ = tls_workers
    with trio.fail_after(GUARD):
        with pytest.raises(
            RemoteConnectionError,
            match=re.escape(
                f"cannot connect to the worker at 127.0.0.1:{a.port}: the worker is running but "
                f"refused this client: this worker speaks TLS: a client opens the runtime "
                f"with remote_tls_ca=FILE, the CA that signed the worker's --tls-cert (or "
                f"sets ACTORGRAPH_TLS_CA=FILE; the actorgraph command: --tls-ca FILE)"
            ),
        ):
            async with runtime([a.name("CPU:0")]):
                pass


async def test_a_tls_client_at_a_plain_worker_is_told_it_does_not_speak_tls(
    certs: Certificates, workers: tuple[Worker, Worker]
) -> None:
    worker, _ = workers
    with trio.fail_after(GUARD):
        with pytest.raises(
            RemoteConnectionError,
            match=re.escape(
                f"cannot connect to the worker at 127.0.0.1:{worker.port}: the worker does not "
                f"speak TLS (it answered the TLS handshake with plain frames); start it with "
                f"--tls-cert and --tls-key, or leave out remote_tls_ca"
            ),
        ):
            async with runtime([worker.name("CPU:0")], remote_tls_ca=certs.ca):
                pass


async def test_a_link_to_a_tls_worker_checks_its_certificate(
    certs: Certificates, tls_workers: tuple[Worker, Worker]
) -> None:
    # A worker linking to a TLS worker: with a CA that did not sign its certificate, and
    # without TLS at all, the link is refused saying why; with the CA it reads.
    a, _ = tls_workers
    with trio.fail_after(GUARD):
        async with runtime([a.name("CPU:0")], remote_tls_ca=certs.ca) as rt:
            x = rt.alloc(a.name("CPU:0"), 4, np.int32)
            await rt.copyin(x, np.arange(4, dtype=np.int32))
            conn = rt.device(a.name("CPU:0")).connection
            ref = (x.memory.handle, 0, (4,))
            args = ("127.0.0.1", a.port, conn.session_id, ref, conn.ticket(ref[0]))
            refusals = {
                certs.other_ca: r"the worker's certificate was refused \(.+\); give this "
                r"worker's --tls-ca the CA that signed the worker's --tls-cert",
                None: r"this worker speaks TLS: .* a worker linking to it needs --tls-cert "
                r"and --tls-key of its own",
            }
            async with trio.open_nursery() as nursery:
                for ca in (certs.other_ca, None, certs.ca):
                    tls = None if ca is None else client_context(ca, "--tls-ca")
                    peers = Peers(Limits(), TOKEN, tls)
                    peers.start(nursery)
                    out = bytearray(16)
                    if ca == certs.ca:
                        await peers.pull(*args, memoryview(out))
                        np.testing.assert_array_equal(np.frombuffer(out, np.int32), np.arange(4))
                        continue
                    with pytest.raises(
                        PeerRefusedError,
                        match=rf"worker-to-worker link to 127.0.0.1:{a.port} refused: "
                        + refusals[ca],
                    ):
                        await peers.pull(*args, memoryview(out))
                nursery.cancel_scope.cancel()


async def test_tls_files_that_cannot_be_used_are_named(
    certs: Certificates, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(DeviceError, match=r"remote_tls_ca='/no/such/ca.pem': no such file"):
        async with runtime(["CPU:0@127.0.0.1:1"], remote_tls_ca="/no/such/ca.pem"):
            pass
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(DeviceError, match=r"remote_tls_ca=.* holds no CA certificate"):
        async with runtime(["CPU:0@127.0.0.1:1"], remote_tls_ca=not_pem):
            pass
    from actorgraph._cli import main

    for args, error in (
        (["--tls-cert", str(certs.cert)], "give both"),
        (["--tls-cert", str(certs.cert), "--tls-key", str(certs.cert)], "cannot be loaded"),
        (["--tls-ca", str(certs.ca)], "--tls-ca is for a worker that speaks TLS"),
        (["--tls-cert", "/no/cert.pem", "--tls-key", str(certs.key)], "no such file"),
    ):
        assert main(["worker", "--port", "0", *args]) == 2
        assert error in capsys.readouterr().err


class Relay:
    """A stranger in the middle: passes one connection on to a worker byte for byte,
    keeping what goes by in `seen`; `inject` puts bytes of its own into the stream to
    the worker."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.seen: list[bytes] = []
        self.to_worker: trio.socket.SocketType | None = None
        self.sending = trio.Lock()  # one send at a time on the worker's socket

    async def serve(self, task_status: trio.TaskStatus[int]) -> None:
        listener = trio.socket.socket()
        await listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        task_status.started(listener.getsockname()[1])
        client, _ = await listener.accept()
        worker = self.to_worker = trio.socket.socket()
        await worker.connect(("127.0.0.1", self.target))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._copy, client, worker)
            nursery.start_soon(self._copy, worker, client)
        listener.close()

    async def _copy(self, src: trio.socket.SocketType, dst: trio.socket.SocketType) -> None:
        try:
            while data := await src.recv(1 << 16):
                self.seen.append(data)
                async with self.sending:
                    await _send_all(dst, data)
        except (OSError, trio.ClosedResourceError):
            pass  # one side hung up: the other goes too
        finally:
            dst.close()
            src.close()

    async def inject(self, data: bytes) -> None:
        assert self.to_worker is not None
        async with self.sending:
            await _send_all(self.to_worker, data)


async def _send_all(sock: trio.socket.SocketType, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[await sock.send(view) :]


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
async def test_a_relay_in_the_middle_sees_the_data_only_without_tls(
    certs: Certificates,
    tls_workers: tuple[Worker, Worker],
    workers: tuple[Worker, Worker],
    tls: bool,
) -> None:
    # A stranger that passes the whole connection on, byte for byte, gets through the
    # handshake (the token does not seal what follows it): without TLS it reads the
    # buffers that go by; with TLS it reads nothing of them.
    target = tls_workers[0] if tls else workers[0]
    options = {"remote_tls_ca": certs.ca} if tls else {}
    secret = np.frombuffer(b"actorgraph-secret-bytes!" * 64, np.uint8)
    relay = Relay(target.port)
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(relay.serve)
            name = f"CPU:0@127.0.0.1:{port}"
            async with runtime([name], **options) as rt:
                x = rt.alloc(name, secret.size, np.uint8)
                await rt.copyin(x, secret)
                np.testing.assert_array_equal(await rt.copyout(x), secret)
    assert (secret.tobytes()[:64] in b"".join(relay.seen)) is not tls


async def test_a_relay_in_the_middle_cannot_put_requests_into_a_tls_connection(
    certs: Certificates, tls_workers: tuple[Worker, Worker]
) -> None:
    # The stranger adds an alloc and a get of its own to the stream to the worker: the
    # worker's TLS refuses them (they are no TLS records of this connection) and drops
    # the connection, so the client's next call fails, and nothing answers the get.
    a, _ = tls_workers
    relay = Relay(a.port)
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(relay.serve)
            name = f"CPU:0@127.0.0.1:{port}"
            with pytest.raises(ag.ClosedError, match="lost"):
                async with runtime([name], remote_tls_ca=certs.ca) as rt:
                    x = rt.alloc(name, 4, np.int32)
                    await rt.copyin(x, np.arange(4, dtype=np.int32))
                    passed = len(relay.seen)
                    await relay.inject(
                        encode(["alloc", 99, "CPU:0", 4, "<i4"]) + encode(["get", 7, [99, 0, [4]]])
                    )
                    while True:  # until the worker's dropped connection is noticed
                        await rt.copyin(x, np.arange(4, dtype=np.int32))
    # Nothing came back for the get: no frame in the clear after the injection.
    assert b"data" not in b"".join(relay.seen[passed:])


# -- a self-signed certificate made by the TLS page's one line of openssl -------------------


def _readme_openssl_line() -> str:
    page = Path(__file__).parent.parent / "docs" / "howto" / "tls.md"
    lines = [ln.strip() for ln in page.read_text().splitlines() if "openssl req " in ln]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ag_testing.Worker]:
    """A worker with the certificate and key the TLS page's openssl line makes (for
    worker.example, 10.0.0.5, localhost and 127.0.0.1), its CA the certificate itself."""
    if shutil.which("openssl") is None:
        pytest.skip("the TLS page's self-signed certificate line needs the openssl command")
    folder = tmp_path_factory.mktemp("self-signed")
    subprocess.run(shlex.split(_readme_openssl_line()), cwd=folder, check=True, capture_output=True)
    tls = ["--tls-cert", str(folder / "worker.pem"), "--tls-key", str(folder / "worker.key")]
    with ag_testing.start_worker(["CPU:0", "CPU:1"], extra_args=tls) as worker:
        worker.ca = folder / "worker.pem"  # type: ignore[attr-defined]
        yield worker


async def test_the_readme_self_signed_certificate_serves_its_names(
    self_signed: ag_testing.Worker,
) -> None:
    # By address and by name, as the certificate lists them; the token is kept too.
    ca = self_signed.ca  # type: ignore[attr-defined]
    for host in ("127.0.0.1", "localhost"):
        name = f"CPU:0@{host}:{self_signed.port}"
        with trio.fail_after(GUARD):
            async with ag.open_runtime(
                [name], remote_token=self_signed.token, remote_tls_ca=ca
            ) as rt:
                assert rt.device(name).connection.statistics().tls
                x = rt.alloc(name, 1000, np.int32)
                await rt.copyin(x, np.arange(1000, dtype=np.int32))
                np.testing.assert_array_equal(await rt.copyout(x), np.arange(1000))


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from actorgraph._cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_demo_and_bench_reach_a_tls_worker_with_its_ca(
    self_signed: ag_testing.Worker,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ca = str(self_signed.ca)  # type: ignore[attr-defined]
    monkeypatch.delenv("ACTORGRAPH_TLS_CA", raising=False)
    monkeypatch.setenv("ACTORGRAPH_TOKEN_FILE", str(self_signed.token_file))
    demo = ("demo", "--devices", ",".join(["CPU:0", *self_signed.devices]), "--replays", "2")
    # Without the CA, the refusal says how to give it from the command line.
    code, _, err = _cli(capsys, *demo)
    assert code == 2
    assert "(or sets ACTORGRAPH_TLS_CA=FILE; the actorgraph command: --tls-ca FILE)" in err
    code, out, err = _cli(capsys, *demo, "--tls-ca", ca)
    assert (code, err) == (0, "") and "2 replays checked against eager: OK" in out
    bench = ("bench", "--builtin", "--device", self_signed.devices[0], "--items", "4")
    code, out, err = _cli(capsys, *bench, "--replays", "2", "--tls-ca", ca)
    assert (code, err) == (0, "") and "graph replay:" in out
    # From the environment, as for any program that opens a runtime.
    monkeypatch.setenv("ACTORGRAPH_TLS_CA", ca)
    code, out, err = _cli(capsys, *demo)
    assert (code, err) == (0, "") and "2 replays checked against eager: OK" in out
    code, out, err = _cli(capsys, *bench, "--replays", "2")
    assert (code, err) == (0, "") and "graph replay:" in out
    # A variable naming no file is named; a runtime of local devices never reads it.
    monkeypatch.setenv("ACTORGRAPH_TLS_CA", "/no/such/ca.pem")
    code, _, err = _cli(capsys, *demo)
    assert code == 2
    assert (
        "ACTORGRAPH_TLS_CA='/no/such/ca.pem' is not a file; name the PEM file of the CA "
        "that signed the workers' --tls-cert (or unset it for workers without TLS)"
    ) in err
    code, _, err = _cli(capsys, "demo", "--devices", "CPU:0,CPU:1", "--replays", "1")
    assert (code, err) == (0, "")


# -- TLS moves the same bytes as plain TCP, every direction --------------------------------

# Odd sizes and large ones: a byte, a record and a bit, past a frame's chunk, and past
# what one TLS read asks of the socket.
SIZES = (1, 16 * 1024 + 3, (1 << 20) + 1, (5 << 20) + 7, (17 << 20) - 5)


async def _every_direction(workers: tuple[Worker, Worker], **options: object) -> list[bytes]:
    """What each direction delivers of random bytes of every size in SIZES: copyin and
    copyout, graph copies local -> worker, worker -> local, within a worker and worker
    -> worker, then a replayed graph of kernels and copies across all of them."""
    a, b = workers
    a0, a1, b0 = a.name("CPU:0"), a.name("CPU:1"), b.name("CPU:0")
    seen: list[bytes] = []
    async with runtime(["CPU:0", a0, a1, b0], **options) as rt:
        for size in SIZES:
            data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
            local, back = (rt.alloc("CPU:0", size, np.uint8) for _ in range(2))
            x, y, z = (rt.alloc(name, size, np.uint8) for name in (a0, a1, b0))
            await rt.copyin(x, data)  # host -> worker
            seen.append((await rt.copyout(x)).tobytes())  # worker -> host
            await rt.copyin(local, data[::-1].copy())
            await rt.run([ag.Copy(dst=y, src=local)])  # local -> worker
            await rt.run([ag.Copy(dst=z, src=y)])  # worker -> worker, right after
            await rt.run([ag.Copy(dst=y, src=x)])  # within a worker
            await rt.run([ag.Copy(dst=back, src=z)])  # worker -> local
            seen += [(await rt.copyout(v)).tobytes() for v in (back, y, z)]
            graph = await rt.compile(
                [
                    ag.Launch(INC, [x, x]),
                    ag.Copy(dst=y, src=x),
                    ag.Launch(INC, [y, y]),
                    ag.Copy(dst=z, src=y),
                    ag.Copy(dst=local, src=z),
                    ag.Launch(INC, [local, local]),
                    ag.Copy(dst=x, src=local),
                ]
            )
            for _ in range(2):
                await graph()
            seen += [(await rt.copyout(v)).tobytes() for v in (x, y, z, local)]
            await graph.aclose()
            for buffer in (local, back, x, y, z):
                rt.free(buffer)
    return seen


async def test_tls_copies_and_replays_equal_plain_ones_bitwise(
    certs: Certificates,
    tls_workers: tuple[Worker, Worker],
    workers: tuple[Worker, Worker],
) -> None:
    with trio.fail_after(4 * GUARD):
        plain = await _every_direction(workers)
        sealed = await _every_direction(tls_workers, remote_tls_ca=certs.ca)
    assert len(sealed) == len(plain) == 8 * len(SIZES)
    for i, (want, got) in enumerate(zip(plain, sealed, strict=True)):
        assert got == want, f"result {i} differs over TLS"
    # And the plain run itself gave the right bytes (the first of each size: copyout).
    for size, first in zip(SIZES, plain[::8], strict=True):
        data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
        assert first == data.tobytes()


async def _tls_pair(certs: Certificates) -> tuple[TLSSocket, TLSSocket]:
    """Two ends of one TLS connection over a loopback socket pair, handshake done."""
    here, there = socket.socketpair()
    for end in (here, there):
        end.setblocking(False)
    client = client_context(str(certs.ca), "remote_tls_ca")
    server = server_context(str(certs.cert), str(certs.key))
    ends: list[TLSSocket] = []

    async def accept() -> None:
        ends.append(await accept_tls(there, server))

    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept)
            connected = await connect_tls(here, client, "127.0.0.1")
    return connected, ends[0]


async def _send_sealed(end: TLSSocket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[end.send(view) :]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(end.socket)
    while end.backlog:
        try:
            end.flush()
        except BlockingIOError:
            await trio.lowlevel.wait_writable(end.socket)


async def test_a_tls_read_opens_every_record_there_and_waits_only_when_none_is(
    certs: Certificates,
) -> None:
    """A read gives all the plaintext of the records received (several small records in
    one read, a large one across reads into a buffer), raises BlockingIOError when none
    is there, and reads the end once the other side closed, with the bytes intact."""
    writer, reader = await _tls_pair(certs)
    with pytest.raises(BlockingIOError):
        reader.recv(1 << 16)
    small = [bytes([k]) * (100 + k) for k in range(5)]
    for part in small:  # five sends: five records
        await _send_sealed(writer, part)
    # (A socket pair: what one end sent, the other holds.)
    assert reader.recv(1 << 16) == b"".join(small)
    assert reader.pending == 0
    with pytest.raises(BlockingIOError):
        reader.recv(1 << 16)
    # Larger than a record and than a read of the socket, of an odd size.
    large = np.random.default_rng(7).integers(0, 256, (3 << 20) + 13, np.uint8).tobytes()
    into = bytearray(len(large))
    view = memoryview(into)
    have = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_send_sealed, writer, large)
        with trio.fail_after(GUARD):
            while have < len(large):
                try:
                    have += reader.recv_into(view[have:])
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(reader.socket)
    assert bytes(into) == large
    writer.socket.shutdown(socket.SHUT_WR)  # (a close would reset: the writer has unread bytes)
    with trio.fail_after(GUARD):
        while True:
            try:
                assert reader.recv(1 << 16) == b""
                break
            except BlockingIOError:
                await trio.lowlevel.wait_readable(reader.socket)
    assert reader.recv_into(memoryview(bytearray(8))) == 0
    reader.socket.close()
    writer.socket.close()


async def test_a_tls_handshake_reads_the_other_side_a_little_at_a_time(
    certs: Certificates,
) -> None:
    """What a stranger sends in its TLS handshake is read in small pieces: the handshake
    of both ends of a connection takes less memory than half of one bulk read (READ), which
    a connection asks for only once its owner trusts the other side."""
    tracemalloc.start()
    try:
        writer, reader = await _tls_pair(certs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < READ // 2, f"a TLS handshake took {peak} bytes at its peak"
    writer.socket.close()
    reader.socket.close()
