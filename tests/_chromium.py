"""A headless Chromium driven over the DevTools protocol, to look at pages as a person does.

Chromium is started with `--remote-debugging-pipe`: it reads protocol commands from its
file descriptor 3 and writes replies and events to its descriptor 4, each message JSON
ended by a NUL byte, so no websocket (and no package) is needed. One browser, one tab:
`open(url)` loads a page and waits for its load event, `evaluate(js)` runs an expression
in it, `screenshot()` takes a PNG of the viewport.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from types import TracebackType
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-pipe",
    "--window-size=1280,1600",
]


class BrowserError(RuntimeError):
    """Chromium did not answer in time, answered with an error, or exited."""


class Browser:
    """A headless Chromium with one tab; `guard` bounds every wait for it, in seconds."""

    def __init__(self, guard: float = 60.0) -> None:
        if CHROMIUM is None:
            raise BrowserError("no chromium on PATH")
        self.guard = guard
        self._profile = tempfile.TemporaryDirectory(
            prefix="ag-chromium-", ignore_cleanup_errors=True
        )
        commands_r, self._commands = os.pipe()  # we write commands, it reads fd 3
        self._replies, replies_w = os.pipe()  # it writes fd 4, we read replies

        def descriptors() -> None:  # in the child, before its other descriptors close
            os.dup2(commands_r, 3)
            os.dup2(replies_w, 4)

        self._process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
            pass_fds=(3, 4),  # kept open in the child after descriptors() made them
            preexec_fn=descriptors,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its helper processes go with it (close)
        )
        os.close(commands_r)
        os.close(replies_w)
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})
        self._session = attached["sessionId"]
        self._send("Page.enable", session=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Ask the browser to quit, then end its processes if it has not."""
        try:
            self._send("Browser.close")
        except (BrowserError, OSError):
            pass  # it is gone already, or does not answer: ended below
        try:
            self._process.wait(timeout=self.guard)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self._process.pid, signal.SIGKILL)  # helpers left behind, if any
        except ProcessLookupError:
            pass
        self._process.wait()
        for fd in (self._commands, self._replies):
            os.close(fd)
        self._profile.cleanup()

    # -- the protocol --

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._replies], [], [], max(left, 0.0))
            if not ready:
                raise BrowserError(f"chromium did not answer within {self.guard} s")
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:
                raise BrowserError("chromium exited")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return dict(json.loads(message))

    def _send(
        self, method: str, params: dict[str, Any] | None = None, *, session: bool = False
    ) -> dict[str, Any]:
        self._next_id += 1
        command: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            command["sessionId"] = self._session
        os.write(self._commands, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + self.guard
        while True:
            message = self._read_message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self._events.append(message)

    def _wait_event(self, method: str) -> None:
        deadline = time.monotonic() + self.guard
        while True:
            for i, event in enumerate(self._events):
                if event.get("method") == method:
                    del self._events[: i + 1]
                    return
            self._events.append(self._read_message(deadline))

    # -- what a test does --

    def open(self, url: str) -> None:
        """Load `url` in the tab and wait for its load event."""
        self._events.clear()
        self._send("Page.navigate", {"url": url}, session=True)
        self._wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able)."""
        result = self._send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self) -> bytes:
        """A PNG of the page as it is drawn."""
        data = self._send("Page.captureScreenshot", {"format": "png"}, session=True)["data"]
        return base64.b64decode(data)
