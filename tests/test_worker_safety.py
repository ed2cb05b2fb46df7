"""A worker safe by default, and what it says of the connections it turns away.

Off loopback a worker speaks TLS unless told `--insecure-plaintext`; every connection it
refuses (a wrong token, another protocol version, an oversized frame, plain at a TLS
worker) or drops (an authenticated one whose framing broke) is said with its address and
reason, at most a line per kind every 10 s (`-v`: per address), so a flood of them is no
flood of lines. Workers here run in this process on real loopback sockets, each refused
connection from its own loopback address (127.0.0.N), so a verbose worker's lines can be
told apart.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from _workers import GUARD, TOKEN, hello, runtime
from actorgraph.devices.remote.frames import HEADER, FrameStream, encode
from actorgraph.devices.remote.wire import (
    HANDSHAKE_LIMITS,
    TO_WORKER,
    VERSION,
    Limits,
    handshake_mac,
)

from actorgraph import ActorGraphError
from actorgraph.testing import start_worker
from actorgraph.worker import run_worker
from actorgraph.worker._admission import MOST_ADDRESSES, RareLog
from actorgraph.worker._listen import is_loopback

trustme = pytest.importorskip("trustme", reason="the TLS worker's certificate is made with trustme")


@asynccontextmanager
async def _worker(**options: Any) -> AsyncIterator[int]:
    """A worker in this process on 127.0.0.1 with the test token: its port."""
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(
            lambda task_status: run_worker(
                ["CPU:0"], "127.0.0.1", 0, token=TOKEN, task_status=task_status, **options
            )
        )
        yield port
        nursery.cancel_scope.cancel()


async def _from(n: int, port: int) -> trio.socket.SocketType:
    """A connection to the worker from loopback address 127.0.0.`n`."""
    sock = trio.socket.socket()
    await sock.bind((f"127.0.0.{n}", 0))
    await sock.connect(("127.0.0.1", port))
    return sock


async def _until_closed(sock: trio.socket.SocketType) -> None:
    """Read until the worker closes the connection (a reset, where it closed with bytes
    of ours unread)."""
    try:
        while await sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    sock.close()


async def _wrong_token(port: int, n: int) -> None:
    stream = FrameStream(await _from(n, port), Limits())
    ours, theirs, _ = await hello(stream, "client")
    mac = handshake_mac(b"not the token", "client", ours, theirs, TO_WORKER)
    await stream.send([encode(["auth", mac, []])])
    await _until_closed(stream.sock)


async def _old_version(port: int, n: int) -> None:
    sock = await _from(n, port)
    meta = encode(["hello", "client", b"n" * 32])[HEADER.size :]
    await sock.send(HEADER.pack(b"AG", VERSION - 1, len(meta), 0) + meta)
    await _until_closed(sock)


async def _oversized_stranger(port: int, n: int) -> None:
    sock = await _from(n, port)
    await sock.send(HEADER.pack(b"AG", VERSION, HANDSHAKE_LIMITS.max_meta + 1, 0))
    await _until_closed(sock)


async def _oversized_client(port: int, n: int) -> None:
    # An authenticated client whose frame is over the worker's limits: dropped.
    stream = FrameStream(await _from(n, port), Limits())
    ours, theirs, _ = await hello(stream, "client")
    mac = handshake_mac(TOKEN, "client", ours, theirs, TO_WORKER)
    await stream.send([encode(["auth", mac, []])])
    welcome, _ = await stream.receive()
    assert welcome[0] == "welcome", welcome
    await stream.send([HEADER.pack(b"AG", VERSION, 16, Limits().max_tail + 1)])
    await _until_closed(stream.sock)


async def test_a_verbose_worker_says_each_refused_address_and_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with trio.fail_after(GUARD):
        async with _worker(verbose=True) as port:
            await _wrong_token(port, 2)
            await _old_version(port, 3)
            await _oversized_stranger(port, 4)
            await _oversized_client(port, 5)
            # A second refusal from an address within 10 s is counted, not said.
            await _wrong_token(port, 2)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "connection(s)" in line]
    refused = "actorgraph worker: refused 1 connection(s) that did not authenticate (latest from "
    assert lines[:4] == [
        f"{refused}127.0.0.2: authentication failed: wrong or missing token)",
        f"{refused}127.0.0.3: protocol version {VERSION - 1} is not supported (this side "
        f"speaks {VERSION}))",
        f"{refused}127.0.0.4: frame meta of {HANDSHAKE_LIMITS.max_meta + 1} bytes is outside "
        f"1..{HANDSHAKE_LIMITS.max_meta}: before it proves the token, a connection's frames "
        f"are at most {HANDSHAKE_LIMITS.max_meta} bytes (a handshake message); is this an "
        f"actorgraph client of this version?)",
        "actorgraph worker: closed 1 authenticated connection(s) whose framing broke (latest "
        f"from 127.0.0.5: frame tail of {Limits().max_tail + 1} bytes is over the limit of "
        f"{Limits().max_tail})",
    ]
    # The worker's stop says what was counted and not said yet.
    assert lines[4:] == [f"{refused}127.0.0.2: authentication failed: wrong or missing token)"]


async def test_a_worker_says_refusals_once_per_kind_with_the_latest_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Without -v, refusals from every address share a line every 10 s: the first is said
    # at once, the others counted and said with the latest address and reason.
    with trio.fail_after(GUARD):
        async with _worker() as port:
            await _wrong_token(port, 2)
            await _old_version(port, 3)
            await _wrong_token(port, 4)
    err = capsys.readouterr().err
    refused = "actorgraph worker: refused {} connection(s) that did not authenticate (latest from "
    assert [line for line in err.splitlines() if "connection(s)" in line] == [
        refused.format(1) + "127.0.0.2: authentication failed: wrong or missing token)",
        refused.format(2) + "127.0.0.4: authentication failed: wrong or missing token)",
    ]


async def test_a_plain_client_at_a_tls_worker_is_said_with_its_address(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    leaf.private_key_pem.write_to_path(str(key))
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    with trio.fail_after(GUARD):
        async with _worker(tls_cert=cert, tls_key=key, verbose=True) as port:
            sock = await _from(6, port)
            await sock.send(encode(["hello", "client", b"n" * 32]))
            await _until_closed(sock)
    err = capsys.readouterr().err
    assert (
        "actorgraph worker: refused 1 connection(s) that did not authenticate (latest from "
        "127.0.0.6: it does not speak TLS)"
    ) in err.splitlines()


async def test_a_flood_from_many_addresses_is_a_bounded_table_and_few_lines(
    autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    # A verbose log keeps at most MOST_ADDRESSES addresses apart: past them, a refusal
    # from yet another address is counted under its kind alone. Over 35 s of a flood
    # from ten times as many addresses, each address's line is said once per 10 s at
    # most, and every refusal is counted in some line.
    log = RareLog(verbose=True)
    addresses = [f"10.0.{i // 256}.{i % 256}" for i in range(10 * MOST_ADDRESSES)]
    async with trio.open_nursery() as nursery:
        log.start(nursery)
        for _second in range(35):
            for address in addresses:
                log.note("refused", f"refused {{count}} (latest from {address})", address)
            assert len(log._next) <= MOST_ADDRESSES + 1
            await trio.sleep(1)
        log.flush()
        nursery.cancel_scope.cancel()
    lines = capsys.readouterr().err.splitlines()
    counted = sum(int(re.search(r"refused (\d+)", line)[1]) for line in lines)  # type: ignore[index]
    assert counted == 35 * len(addresses)
    # Of the 89,600 refusals, a line per kept address and one for the rest every 10 s
    # (4 rounds in 35 s), and the stop's: about 5 rounds of MOST_ADDRESSES + 1 lines.
    assert len(lines) <= 6 * (MOST_ADDRESSES + 1)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("::", False),
        ("worker.example", False),
    ],
)
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


async def test_a_worker_beyond_loopback_speaks_tls_unless_told_otherwise() -> None:
    with pytest.raises(
        ActorGraphError,
        match=re.escape(
            "refusing to serve 0.0.0.0 over plain TCP: off loopback, anyone on the network "
            "path reads the buffers and can take over a connection after its handshake (the "
            "token does not protect that); give --tls-cert and --tls-key (the docs page 'TLS "
            "between clients and workers' gives one `openssl req -x509 ...` line that makes a "
            "self-signed pair), or pass "
            "insecure_plaintext=True on a network you trust"
        ),
    ):
        await run_worker(["CPU:0"], "0.0.0.0", 0, token=TOKEN)


def test_the_command_refuses_plain_tcp_beyond_loopback_naming_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from actorgraph._cli import main

    token = tmp_path / "token"
    token.write_bytes(TOKEN)
    assert main(["worker", "--host", "0.0.0.0", "--port", "0", "--token-file", str(token)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("actorgraph worker: refusing to serve 0.0.0.0 over plain TCP")
    assert "or pass --insecure-plaintext on a network you trust" in err
    # With the flag it serves (here on every address, this test's client over loopback).
    with start_worker(
        ["CPU:0"], host="0.0.0.0", token=TOKEN, extra_args=["--insecure-plaintext"]
    ) as worker:
        assert f"listening on 0.0.0.0:{worker.port}" in worker.output

        async def copy_through() -> None:
            name = f"CPU:0@127.0.0.1:{worker.port}"
            with trio.fail_after(GUARD):
                async with runtime([name]) as rt:
                    x = rt.alloc(name, 5, np.int32)
                    await rt.copyin(x, np.arange(5, dtype=np.int32))
                    np.testing.assert_array_equal(await rt.copyout(x), np.arange(5))

        trio.run(copy_through)
