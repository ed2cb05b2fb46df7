"""The REMOTE handshake (actorgraph/devices/remote/handshake.py, actorgraph/worker/
_handshake.py): mutual, each MAC bound to the role, both nonces and its direction, so a
stranger without the token gets nowhere by relaying what a token holder says; and a
peer of another protocol version is refused, naming both versions.

The stranger is a real loopback listener without the token. A client (or a worker
opening a link) holding the token is pointed at it; the stranger opens its own
connection to a real worker, hands the worker's challenge to the token holder as its
own, and uses the answer on its connection to the worker.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import numpy as np
import pytest
import trio
from _workers import GUARD, TOKEN, runtime
from actorgraph.devices.remote._transport import RemoteConnectionError
from actorgraph.devices.remote.frames import HEADER, ConnectionLostError, FrameStream, encode
from actorgraph.devices.remote.wire import (
    HANDSHAKE_LIMITS,
    NONCE_BYTES,
    TO_CONNECTOR,
    TO_WORKER,
    VERSION,
    Limits,
    handshake_mac,
)

from actorgraph.testing import Worker
from actorgraph.worker._peers import PeerRefusedError, Peers

# What the worker answers a relayed answer, by the role the stranger asked for.
REFUSALS = {
    "client": "authentication failed: wrong or missing token",
    "peer": "authentication failed: a worker-to-worker link needs this worker's token; "
    "start every worker of a runtime with the same --token-file",
}


async def _connect(port: int) -> FrameStream:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    return FrameStream(sock, Limits())


async def _stranger(
    worker_port: int,
    role: str,
    own_nonce: bool,
    seen: dict[str, Any],
    task_status: trio.TaskStatus[int],
) -> None:
    """Listen; relay the worker's challenge to whoever connects, and its answer to the
    worker, asking for `role` there with the stranger's own nonce (`own_nonce`) or with
    the token holder's. Then use that connection to the worker (an alloc, a get) and
    pose as the worker to the token holder. What the worker answered goes in `seen`."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    task_status.started(listener.getsockname()[1])
    conn, _ = await listener.accept()
    holder = FrameStream(conn, Limits())
    worker = await _connect(worker_port)
    try:
        hello, _ = await holder.receive()
        challenge, _ = await worker.receive()
        nonce = secrets.token_bytes(NONCE_BYTES) if own_nonce else hello[2]
        await worker.send([encode(["hello", role, nonce])])
        await holder.send([encode(challenge)])  # the worker's nonce, as the stranger's own
        auth, _ = await holder.receive()
        devices = ["CPU:0"] if role == "client" else []
        await worker.send([encode(["auth", auth[1], devices])])
        seen["answer"], _ = await worker.receive()
        # Use the connection as if it were in: allocate, and read back.
        try:
            await worker.send(
                [encode(["alloc", 1, "CPU:0", 4, "<i4"]), encode(["get", 1, [1, 0, [4]]])]
            )
            seen["then"], _ = await worker.receive()
        except (ConnectionLostError, OSError):
            seen["then"] = "closed"
        # Pose as the worker: a welcome whose proof the stranger cannot make.
        await holder.send([encode(["welcome", 1, b"k" * 32, Limits().as_wire(), b"\0" * 32])])
        with trio.move_on_after(GUARD):
            await holder.receive()  # until the token holder hangs up
    except (ConnectionLostError, OSError):
        pass
    finally:
        holder.close()
        worker.close()
        listener.close()


@pytest.mark.parametrize(
    ("role", "own_nonce"),
    [("client", True), ("peer", False), ("peer", True)],
    ids=["as-itself", "its-answer-as-a-link", "as-a-link"],
)
async def test_a_client_answer_relayed_by_a_stranger_gets_it_nowhere(
    workers: tuple[Worker, Worker], role: str, own_nonce: bool
) -> None:
    # The client answers the worker's challenge, relayed by the stranger; the worker
    # refuses that answer on the stranger's own connection, as a client and as a link
    # (the MAC is bound to the client's nonce and its role), and the stranger's alloc
    # and get go nowhere; the client refuses the stranger, which cannot prove the token.
    worker, _ = workers
    seen: dict[str, Any] = {}
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(_stranger, worker.port, role, own_nonce, seen)
            with pytest.raises(
                RemoteConnectionError,
                match=rf"cannot connect to the worker at 127.0.0.1:{port}: what answers there "
                r"could not prove it holds this client's token \(its proof of the token is "
                r"wrong\), so it may not be the worker meant",
            ):
                async with runtime([f"CPU:0@127.0.0.1:{port}"]):
                    pass
    assert seen == {"answer": ["error", "frame", 0, REFUSALS[role]], "then": "closed"}


@pytest.mark.parametrize("own_nonce", [True, False], ids=["as-itself", "with-its-nonce"])
async def test_a_link_answer_relayed_by_a_stranger_gets_it_nowhere(
    workers: tuple[Worker, Worker], own_nonce: bool
) -> None:
    # A worker holding the token opens a link to the stranger (a copy names the
    # stranger's address as its source): the stranger relays the real worker's
    # challenge to it. Its answer opens no session on the real worker (as a client; the
    # answer is a link's), nor a link with the stranger's own nonce; and the linking
    # worker refuses the stranger, which cannot prove the token.
    worker, _ = workers
    seen: dict[str, Any] = {}
    role = "client" if not own_nonce else "peer"
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(_stranger, worker.port, role, own_nonce, seen)
            peers = Peers(Limits(), TOKEN)
            peers.start(nursery)
            with pytest.raises(
                PeerRefusedError,
                match=rf"worker-to-worker link to 127.0.0.1:{port} refused: what answers there "
                r"could not prove it holds this worker's token \(its proof of the token is "
                r"wrong\); start every worker of a runtime with the same --token-file",
            ):
                await peers.pull("127.0.0.1", port, 1, (1, 0, (4,)), b"t" * 16, memoryview(b""))
            nursery.cancel_scope.cancel()
    assert seen == {"answer": ["error", "frame", 0, REFUSALS[role]], "then": "closed"}


async def test_the_worker_proves_it_holds_the_token(workers: tuple[Worker, Worker]) -> None:
    # The worker's welcome carries its MAC in the other direction: made with the token,
    # bound to both nonces; the client's own answer is not it.
    worker, _ = workers
    with trio.fail_after(GUARD):
        stream = await _connect(worker.port)
        ours = secrets.token_bytes(NONCE_BYTES)
        await stream.send([encode(["hello", "client", ours])])
        challenge, _ = await stream.receive()
        mac = handshake_mac(TOKEN, "client", ours, challenge[1], TO_WORKER)
        await stream.send([encode(["auth", mac, ["CPU:0"]])])
        welcome, _ = await stream.receive()
        assert welcome[0] == "welcome"
        assert welcome[4] == handshake_mac(TOKEN, "client", ours, challenge[1], TO_CONNECTOR)
        assert welcome[4] != mac
        stream.close()
        # A stranger posing as a worker that needs no token is refused as well.
        listener = trio.socket.socket()
        await listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        async def pose() -> None:
            conn, _ = await listener.accept()
            fake = FrameStream(conn, Limits())
            await fake.send([encode(["challenge", b"n" * NONCE_BYTES, False])])
            with trio.move_on_after(GUARD), pytest.raises(ConnectionLostError):
                while True:
                    await fake.receive()  # until the client hangs up
            fake.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pose)
            port = listener.getsockname()[1]
            with pytest.raises(
                RemoteConnectionError,
                match=r"could not prove it holds this client's token \(it asks for no token, "
                r"so it cannot prove it holds this side's token\)",
            ):
                async with runtime([f"CPU:0@127.0.0.1:{port}"]):
                    pass
            nursery.cancel_scope.cancel()
        listener.close()


async def test_a_peer_of_another_version_is_refused_naming_both(
    workers: tuple[Worker, Worker],
) -> None:
    # A worker of the previous version (its challenge's frame says version VERSION - 1):
    # the client says which versions meet. A client of that version, at this worker: the
    # worker answers its first frame naming both, and closes.
    worker, _ = workers
    old = VERSION - 1
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    async def old_worker() -> None:
        conn, _ = await listener.accept()
        meta = encode(["challenge", b"n" * 32, True])[HEADER.size :]
        await conn.send(HEADER.pack(b"AG", old, len(meta), 0) + meta)
        with trio.move_on_after(GUARD):
            while await conn.recv(1 << 16):
                pass
        conn.close()

    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(old_worker)
            port = listener.getsockname()[1]
            with pytest.raises(
                RemoteConnectionError,
                match=re.escape(
                    f"cannot connect to the worker at 127.0.0.1:{port}: WireError: protocol "
                    f"version {old} is not supported (this side speaks {VERSION}); what answers "
                    f"there does not speak this version's worker protocol: check the address, "
                    f"and that the worker runs the same actorgraph version"
                ),
            ):
                async with runtime([f"CPU:0@127.0.0.1:{port}"]):
                    pass
        listener.close()
        # An old client at this worker: it reads the worker's challenge (a frame of this
        # version) and its own first frame is refused, naming both versions.
        stream = await _connect(worker.port)
        challenge, _ = await stream.receive()
        assert challenge[0] == "challenge"
        meta = encode(["auth", "client", b"", ["CPU:0"]])[HEADER.size :]
        await stream.sock.send(HEADER.pack(b"AG", old, len(meta), 0) + meta)
        refusal, _ = await stream.receive()
        assert refusal == [
            "error",
            "frame",
            0,
            f"protocol version {old} is not supported (this side speaks {VERSION})",
        ]
        stream.close()
        # And the worker goes on serving clients of this version.
        async with runtime([worker.name("CPU:0")]) as rt:
            x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
            await rt.copyin(x, np.arange(4, dtype=np.int32))
            np.testing.assert_array_equal(await rt.copyout(x), np.arange(4))


async def test_a_client_refuses_a_large_handshake_frame_unread() -> None:
    # What answers a client is not trusted until it proves the token: a frame larger
    # than a handshake message is refused at its header, not waited for and held.
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    size = 1 << 20

    async def big_talker() -> None:
        conn, _ = await listener.accept()
        await conn.send(HEADER.pack(b"AG", VERSION, size, 0))
        with trio.move_on_after(GUARD):
            while await conn.recv(1 << 16):  # until the client hangs up
                pass
        conn.close()

    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(big_talker)
            port = listener.getsockname()[1]
            with pytest.raises(
                RemoteConnectionError,
                match=re.escape(
                    f"cannot connect to the worker at 127.0.0.1:{port}: WireError: frame meta "
                    f"of {size} bytes is outside 1..{HANDSHAKE_LIMITS.max_meta}: a worker's "
                    f"handshake messages are at most {HANDSHAKE_LIMITS.max_meta} bytes; what "
                    f"answers there does not speak this version's worker protocol"
                ),
            ):
                async with runtime([f"CPU:0@127.0.0.1:{port}"], remote_timeout=GUARD):
                    pass
        listener.close()


async def test_a_worker_on_a_cpu_with_many_features_welcomes_its_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker says its CPU's features in its Welcome, which a client reads with the
    # handshake's small limits: however many features its CPU names, it must say what
    # fits (a feature it leaves out is one it is taken to lack: a program needing it is
    # refused, never run).
    from actorgraph.devices.remote import machine

    from actorgraph.worker._server import run_worker

    many = frozenset(
        [f"f{k}" for k in range(600)] + [f"a_feature_named_at_length_{k}" for k in range(600)]
    )
    monkeypatch.setattr(machine, "_host_features", lambda: many)
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(
                lambda task_status: run_worker(["CPU:0"], token=TOKEN, task_status=task_status)
            )
            async with runtime([f"CPU:0@127.0.0.1:{port}"], remote_timeout=GUARD) as rt:
                cpu = rt.device(f"CPU:0@127.0.0.1:{port}").connection.statistics().worker_cpu
                assert cpu.features and cpu.features <= many
                x = rt.alloc(f"CPU:0@127.0.0.1:{port}", 4, np.int32)
                await rt.copyin(x, np.arange(4, dtype=np.int32))
                np.testing.assert_array_equal(await rt.copyout(x), np.arange(4))
            nursery.cancel_scope.cancel()


def test_the_largest_welcome_the_protocol_allows_fits_a_handshake_frame() -> None:
    from actorgraph.devices.remote.frames import decode_meta
    from actorgraph.devices.remote.wire import (
        MAX_CPU_FEATURE_CHARS,
        MAX_CPU_FEATURES,
        Welcome,
        WireError,
        decode,
    )

    def sent(message: Any) -> Any:  # as the other side reads it
        frame = encode(message)
        assert len(frame) - HEADER.size <= HANDSHAKE_LIMITS.max_meta
        return decode(decode_meta(frame[HEADER.size :], HANDSHAKE_LIMITS))

    limits = Limits(**{name: 1 << 62 for name in Limits().as_wire()}).as_wire()
    features = [f"{k:0{MAX_CPU_FEATURE_CHARS}d}" for k in range(MAX_CPU_FEATURES)]
    largest = Welcome(1 << 62, b"k" * 64, limits, b"p" * 64, ("m" * 32, features), True)
    assert sent(largest) == largest
    over = Welcome(1, b"k", {}, b"", ("x86_64", [*features, "one_more"]), True)
    with pytest.raises(
        WireError,
        match=re.escape(f"cpu features must be a list of at most {MAX_CPU_FEATURES} entries"),
    ):
        sent(over)
    long = Welcome(1, b"k", {}, b"", ("x86_64", ["x" * (MAX_CPU_FEATURE_CHARS + 1)]), True)
    with pytest.raises(
        WireError,
        match=re.escape(f"cpu feature must be a str of at most {MAX_CPU_FEATURE_CHARS} chars"),
    ):
        sent(long)
