"""REMOTE devices: the devices of a worker (`actorgraph worker`), seen from a client.

This package is a kind of device, beside CPU, SIM and CUDA: it imports only the rest of
actorgraph.devices. The worker that serves these devices is an application on the
runtime, in its own package (actorgraph/worker/). Both sides speak the messages of
`wire.py` (typed and versioned) in the frames of `frames.py`; this docstring describes
the protocol as a whole.

A remote device is named `KIND:N@HOST:PORT` (`CPU:0@127.0.0.1:7000`: device CPU:0 of the
worker listening on 127.0.0.1:7000). All remote devices of one worker in a runtime share
one `Connection`: one TCP connection and one actor task that stands, in the plan, for
every queue of that worker.

The files:

    _device.py      RemoteDevice and RemoteQueue: lowering items to program entries
    _connection.py  the connection actor: batches, mirrored signals, reports
    _programs.py    op lists as programs a worker keeps; copies asked for ahead
    _transport.py   its socket: sending in order, the reader task, a caller's own reads
    _sealed.py      TLS records sealed and opened in memory over the socket (TLSSocket)
    _clock.py       the worker's clock against the client's, for profiles
    _fields.py      the field checks of wire.py, and decoding and encoding a message by
                    its table

and the public modules both sides use (the worker imports these, never a private one):

    wire.py         the protocol's messages, typed and versioned: one table of them
    frames.py       frames over a socket: header, msgpack meta, raw tail
    handshake.py    the connecting side of the handshake (a client, or a worker linking):
                    mutual, each MAC bound to the role, both nonces and its direction
    tls.py          TLS under a connection: contexts, and its handshakes and refusals
    machine.py      compiled CPU programs shipped to a worker, the CPU they need, and
                    the check both sides make before one runs

and the worker's (actorgraph/worker/):

    _server.py      `actorgraph worker`: the server, accepting and routing connections
    _listen.py      where it may listen, and in what (TLS beyond loopback)
    _handshake.py   the worker's side of the handshake
    _session.py     one client's state on a worker: buffers, programs, blobs, mirrors
    _batches.py     a client's batches: checked, posted or run where they arrive, reported
    _lowering.py    a program's entries checked and lowered onto a queue actor
    _lowered.py     a client's program as a worker lowered it; refusals
    _links.py       what a worker answers on a link another worker opened to it
    _peers.py       the links a worker opens to other workers (copies between workers)
    _outbox.py      the frames a worker sends on a connection, in order
    _progress.py    how far a client's queues on a worker have got, and what is then due
    _placement.py   where a worker runs a small CPU kernel: its event loop or a thread
    _staging.py     host memory a worker's host writes land in
    _kernels.py     the worker's kernel registry (--kernels)
    _machine_code.py  shipped programs a session keeps (--allow-programs): checked, loaded

Jobs a worker holds on a wait, and runs on in the task that satisfies it, are the
devices' own (devices/_inline.py); so are a client's: the local jobs of a replay that
also runs on workers run where it is submitted while their queues are idle, and one
that waits on a worker's queue is held on its signal (a `RemoteSignal`), run on by the
task that takes the worker's report. A transfer between a local queue and a worker is
a `Quick` op there: a push whose bytes the socket takes at once, or a pull whose bytes
came ahead, needs no task of its own.

Every end that reads messages (the client's transport, the worker's server and session,
a link's two ends) decodes a frame and hands the message to its handler in a table keyed
by the message's type: one lookup per frame, and a type an end does not take is refused.

How a replay runs
-----------------
The planner sees a remote device as an ordinary device with a compute and a copy queue
(each a `RemoteQueue`; on the worker, each runs on a queue actor of the client's own).
Kernels go to the compute queue; copies within a worker or from another worker, and host
writes and reads, to the copy queue; a copy between a remote and a client-local device
goes to the local device's copy queue (`DeviceCaps.host_io`). Each message list is lowered as for any device: waits, signals and items,
where an item is a *wire entry* (kernel by name, buffers by handle) instead of a call.
`RemoteQueue.post` does not run the job: it hands it to the connection actor. Because a
submission posts all of its jobs synchronously, the connection actor wakes to find every
job of the submission for its worker side by side, and sends them as ONE batch frame:

    ["batch", batch id, bases, [program ids], [[signal id, value], ...], ...]

The worker keeps each queue's lowered program (defined by a "prog" frame the first time a
job's op list is seen, then referred to by id), so a replay of a graph that lives on one
worker costs one frame out and one "done" frame back per queue: one round trip. Items
whose input buffers or var values are rebound produce new op lists: one written as the
entries of a program the worker keeps (a graph bound again to inputs it had before, or
to any var values; eager work on the same buffers again) names that program, any other
is defined (and kept: the least recently used of more than 256 is forgotten). A call of
shipped code ("x") carries no var values: each batch sends those of its programs' calls
(`Batch.values`), so a decoder's step at a position never seen is the program it was at
the last one. A host read ("hr") is numbered among its program's reads, and each batch
names the read id of each (`Batch.reads`); a host write ("hw") says how many blobs its
bytes come in, and each batch names them (`Batch.blobs`, each blob a frame ahead of the
batch). So a copy to or from a buffer is a program kept like any other. The worker answers the frames that came together (a submission's batches)
in one send, after the last of them.

How order crosses hosts
-----------------------
A plan orders queues with `Wait(queue, value)` messages on timeline signals. On the worker
each wait becomes one of:

- a *local* wait, when the signal is another queue of the same worker in the same batch
  (named by device and queue kind):
  the worker waits on its own actor's signal, with the base it reserved for this batch;
- a *mirror* wait, for every other signal (a client-local queue, a queue of another
  worker, a device timeline, the runtime's KICK): the worker waits on a mirror of that
  signal that holds the client's absolute value. The batch carries the current value of
  every mirror it uses; for a wait not yet satisfied, the connection has the client's
  signal call it back when it gets there (`Signal.when`: from the task that moves it, no
  task of its own), and sends ["ext", [[id, value]]] then, unless a push carried it.
- a *watched* mirror wait, when the signal is a queue of a CPU device of another worker:
  the program names that queue (address, session, queue, and a watch ticket: an HMAC
  under the source session's key), and the worker asks the source's worker as the batch
  arrives (["pwatch", ..., queue, value] on a kept link, or the copy's own "pwhen" read
  when a copy from that worker follows the wait). The source's worker answers from the
  task that moves its queue there: its client's own actor there has a signal that maps
  each of its values to the client's (`TrackedSignal`), so any signal, reported or not,
  can answer. The client forwards such a signal only if it loses the source's worker,
  which is what lets the destination go on then.

A device's timeline (which orders whole submissions on the device) is a client signal
like any other, but a submission whose jobs touching a worker's device all run on that
worker has the worker move its mirror of that timeline itself, as those jobs end
(`Batch.advances`): the device's next submission then goes on there with no word from
the client (which sends nothing when its own timeline gets there). A queue off the
worker that touches the device (a client-local copy, another worker's copy of its bytes)
leaves it to the client, as before.

The other way, the worker reports its queues' signals ("sig" frames, "done" at the end),
and the connection sets the `RemoteQueue`'s signal on the client, so client-local queues
wait on remote queues as on local ones. Only the signals a client-local queue waits on
are reported (the plan marks them: a `SignalOp` whose `host` is False is waited on only
by queues of workers, see `RemoteQueue.waits_without_host`), so a chain between two
devices of one worker, or between two workers, sends nothing back until its jobs end.

Copies between a client-local device and a remote one run on the local device's copy
queue as an AWAIT op that pushes or pulls the bytes. A push followed at once by its
queue's signal carries that signal's new value for the worker's mirror in the same send:
the worker takes frames in order, so what waits there runs as the bytes land. A pull that
follows a wait on a queue of the worker is asked for when the local job makes its first
transfer with that worker (["getwhen", read id, buffer, queue, value]): the worker sends
the bytes from the task that gets its queue to the value, in the same send as that
signal's report, and the pull copies them from where they landed. Either way a step
between a client-local device and a worker is one message.

Frames leave from the task that makes them when the socket takes them at once (a
submission's batch from the submitter, a report from the worker's actor), and a batch
whose queues are idle runs in the worker's reader task, as a replay on idle local queues
runs in its caller's. The caller of a replay living on one worker reads the worker's
frames itself while it waits (`Connection.wait_done`), so the report that ends it wakes
that task directly, not a reader task that then wakes it: a replay on one worker costs
neither side a task switch. Only one task reads at a time: the connection's reader task
waits for frames in a wait a caller may cancel (it loses nothing) to take the socket,
and gets it back when that caller's replay ends, when it is cancelled, or when a frame
with bytes comes (those the reader task reads). A caller that finds the socket taken
waits as before; another task's replay ending meanwhile is read by whoever reads. When
a caller's replay ends with nothing else in flight, the reader task is not woken: the
next send wakes it (unless its caller reads its own replay's end), and a call that
checks the connection peeks at the socket, so a worker lost while idle is still found.
A replay on one worker then costs the client one scheduler pass, as a bare round trip. A job of
such a batch that meets a wait on a mirror or on a queue of its client's own is held
there, and runs on in whichever task moves that signal (devices/_inline.py): the link reader that
lands a copy's bytes from another worker runs the copy, the kernel after it and sends
the next bytes, so a step between two workers costs the receiving worker no task switch
either. Only ops that need no task run so: at a kernel on the thread (one not seen to be
quick), a pull over a new link or a yield, the job's own actor takes it on.

A copy between two workers runs on the destination's worker and reads the bytes directly
from the source worker over a peer link (opened once and kept, many reads on it), with
a read ticket (an HMAC under the source session's key) that the client puts in the
program. The client also names the wait on the source's queue that the copy follows, so
the destination's worker asks for the bytes as the batch arrives (["pwhen", ..., device,
value]): the source's worker keeps, per session and device, how far its queue has got
in the client's values, and sends the bytes the moment it gets there. They land in
staging memory and raise the destination's mirror of the source queue: the dependency
costs one message from worker to worker, and none through the client. The client still
forwards that signal too, later, which is what lets the destination go on if the source
worker dies. Copies over 1 MiB are read when they run ("pread"), into the destination.

What the client writes to a worker outside its queues (an alloc, a push's bytes) it
counts done once sent, so another worker's read of that buffer could reach the source
first. Each worker the client's programs read from is fenced: before anything that may
let such a read go on, the client tells the reading worker how far its frames to the
source go (["fence", [[host, port, session, bytes]]], where the source's last alloc or
push ends), and the read names that point ("pread"/"pwhen" `after`); the source answers
it once it has taken that many bytes of its client's frames. Bytes read ahead under an
older fence are read again.

Profiles
--------
A profiled replay's batch says so (`Batch.profile`): the worker posts its jobs to their
actors with observers, as the client does for a profiled replay, and before each job's
"done" sends its times (`JobTimes`: per program entry, which is the client's op index,
when it ran or parked, on the worker's clock). The connection puts them on the client's
clock with an offset measured from round trips (`Ping`/`Pong`, and each profiled batch
with its times), keeping the one with the least round trip (_clock.py), so the client's
profile has the worker's queues, each event saying how far off it can be. An unprofiled
batch carries nothing of this, and its worker records nothing.

A lost connection fails every job in flight with `RemoteConnectionError` and advances the
remote queues' signals, so client-local queues waiting on them finish (skipping their
items) and other devices go on working. A link between two workers that fails while
both stay connected makes the waiting worker ask its client to relay (["relay", batch id,
host, port, why]): the client asks the source worker itself (["watch", read id, queue,
value], answered by no bytes once the queue gets there) and forwards the value; a copy
whose bytes did not come reads them over a new link when it runs.
"""

from ._connection import Connection as Connection
from ._device import RemoteDevice as RemoteDevice
from ._device import RemoteQueue as RemoteQueue
from ._device import open_remote_devices as open_remote_devices
from ._transport import RemoteConnectionError as RemoteConnectionError
from ._transport import RemoteError as RemoteError
from .machine import MachineCode as MachineCode
from .machine import WorkerCPU as WorkerCPU
