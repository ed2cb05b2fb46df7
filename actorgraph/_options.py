"""The options users give open_runtime and compile, checked before anything opens or is
planned: the runtime's counts and sizes, the token file of remote devices' workers (the
file ACTORGRAPH_TOKEN_FILE names, when no token option is given) and the CA of their
certificates (the file ACTORGRAPH_TLS_CA names, when remote_tls_ca is not given), and
compile's max_sizes."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Sequence
from typing import Any

from actorgraph.devices import DEVICE_OPTIONS

from ._buffer import Buffer, check_count
from ._errors import UsageError

# Names the token file of the workers for a program that gives no token option itself.
TOKEN_FILE_ENV = "ACTORGRAPH_TOKEN_FILE"
# Names the CA file of TLS workers for a program that gives no remote_tls_ca itself.
TLS_CA_ENV = "ACTORGRAPH_TLS_CA"

# The options of open_runtime(...) the runtime reads itself (the devices read the others).
RUNTIME_OPTIONS = frozenset(
    [
        "timeline_start",
        "verify_plans",
        "profile",
        "max_in_flight",
        "deadlock_check",
        "watchdog",
        "check_replays",
    ]
)


def refuse_unknown(
    options: Iterable[str], where: str = "open_runtime(...)", own: Iterable[str] = ()
) -> None:
    """Refuse an option that neither the runtime nor any kind of device reads (a typo
    would otherwise be ignored), naming the closest known one.

    Args:
        options: the names of the options given.
        where: the call that took them, as the message names it: a call that hands its
            other options on to open_runtime (say `start_runtime(...)`) checks them itself,
            before anything starts.
        own: that call's own keywords, which are known names (and near names) too.

    Raises:
        UsageError: for the first unknown name, with the closest known one if any.
    """
    mine = frozenset(own)
    known = RUNTIME_OPTIONS | DEVICE_OPTIONS | mine
    for name in options:
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        takers = f"{where} nor open_runtime(...)" if mine else "the runtime nor any kind of device"
        raise UsageError(
            f"{where} got an option {name!r} that neither {takers} takes; {hint}the options "
            f"are {', '.join(sorted(known))}"
        )


def _token_file_option(names: Sequence[str], options: dict[str, Any]) -> None:
    """Take the workers' token file from ACTORGRAPH_TOKEN_FILE when no token option is
    given, and check that the token file named for remote devices is one."""
    from_env = None
    if "remote_token" not in options and "remote_token_file" not in options:
        from_env = os.environ.get(TOKEN_FILE_ENV)
        if from_env:
            options["remote_token_file"] = from_env
    path = options.get("remote_token_file")
    if path is None or not any("@" in str(name) for name in names):
        return  # read only for remote devices: a local runtime never needs it
    if not os.path.isfile(path):
        source = "remote_token_file=" if from_env is None else f"{TOKEN_FILE_ENV}="
        raise UsageError(
            f"{source}{os.fspath(path)!r} is not a file; name the file holding the token "
            f"the workers were started with (their --token-file)"
        )


def _tls_ca_option(names: Sequence[str], options: dict[str, Any]) -> None:
    """Take the workers' CA file from ACTORGRAPH_TLS_CA when remote_tls_ca is not given
    and there are remote devices (connections then speak TLS), checking it is a file."""
    if "remote_tls_ca" in options or not any("@" in str(name) for name in names):
        return
    from_env = os.environ.get(TLS_CA_ENV)
    if not from_env:
        return
    if not os.path.isfile(from_env):
        raise UsageError(
            f"{TLS_CA_ENV}={from_env!r} is not a file; name the PEM file of the CA that "
            f"signed the workers' --tls-cert (or unset it for workers without TLS)"
        )
    options["remote_tls_ca"] = from_env


def check_options(names: Sequence[str], options: dict[str, Any]) -> None:
    """Check open_runtime's options in place (counts, sizes, the workers' token file and
    CA), before any device opens; those that go to the devices stay in `options`."""
    refuse_unknown(options)
    _token_file_option(names, options)
    _tls_ca_option(names, options)
    for name in ("timeline_start", "cpu_thread_bytes", "max_in_flight", "check_replays"):
        if name in options:
            check_count(name, options[name])
    if options.get("max_in_flight", 1) < 1:
        raise UsageError(f"max_in_flight must be >= 1, got {options['max_in_flight']}")


def check_max_sizes(
    inputs: Sequence[Buffer], max_sizes: Sequence[int | None] | None
) -> dict[int, int]:
    if max_sizes is None:
        return {}
    limits = list(max_sizes)
    if len(limits) != len(inputs):
        raise UsageError(
            f"max_sizes has {len(limits)} entries for {len(inputs)} inputs; give one per "
            f"input (None for an input of fixed shape)"
        )
    out: dict[int, int] = {}
    for i, limit in enumerate(limits):
        if limit is None:
            continue
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UsageError(f"max_sizes[{i}] must be an int >= 1 or None, got {limit!r}")
        if inputs[i].is_view:
            raise UsageError(
                f"max_sizes[{i}]: input {i} {inputs[i]!r} is a view; only a base buffer may "
                f"vary in size"
            )
        if inputs[i].size > limit:
            raise UsageError(
                f"max_sizes[{i}]={limit} but input {i} {inputs[i]!r} already holds "
                f"{inputs[i].size} elements; declare a maximum at least that large"
            )
        out[i] = limit
    return out


def remote_options(token_file: str | None, tls_ca: str | None) -> dict[str, Any]:
    """The open_runtime options of a command's `--token-file` and `--tls-ca`: those
    given (one left out is taken from ACTORGRAPH_TOKEN_FILE / ACTORGRAPH_TLS_CA)."""
    options: dict[str, Any] = {}
    if token_file is not None:
        options["remote_token_file"] = token_file
    if tls_ca is not None:
        options["remote_tls_ca"] = tls_ca
    return options
