"""A client's batches on a worker: each one job per program, checked, posted or run where
it arrives, its ends reported.

A batch names kept programs (and those sent for it alone) and the client's bases for this
submission. `Batches.run` checks it (in full the first time a set of programs comes
together, then only its ids and bases: a replay of a graph names the same programs each
time), takes each program's timeline values on its actor, asks other workers for what
its jobs wait on (copies' bytes read ahead, watches of their queues), and posts its
jobs, or runs them where it arrived when its queues are idle (devices/_inline.py). Each
job's end is reported to the client as it ends ("done"), wherever it ran.

A batch the client profiles (`Batch.profile`) has each job carry an observer and go to
its actor, which times its items and the waits it parks on, as a profiled replay does
on the client; before each job's "done" go its times (`JobTimes`), on this worker's
`time.perf_counter`, each span named by its program entry, with when the batch came and
when they were sent (a round trip of the client's clock measurement). A batch that is
not profiled records and sends nothing of this.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, NamedTuple

from actorgraph.devices import (
    BATCH,
    FIRST_QUEUE_SLOT,
    InlineRun,
    Job,
    JobProfile,
    QueueActor,
    Quick,
    Signal,
    Submission,
)
from actorgraph.devices.remote.wire import Batch, Done, JobTimes, Ref, Relay, Sig

from ._lowered import Program, Refused
from ._peers import PeerRefusedError

if TYPE_CHECKING:
    from ._peers import PeerRead
    from ._session import Session

# What a batch names for its programs' host reads and writes (Batch.reads, Batch.blobs).
_READS_RULE = (
    "its programs have {wanted} host reads and it names read ids for {named}; a batch "
    "names one read id for each host read of each of its programs, in order"
)
_BLOBS_RULE = (
    "its programs' host writes land {wanted} blobs and it names {named}; a batch names the "
    "blobs of each of its programs' host writes, in order"
)
_VALUES_RULE = (
    "its programs' calls of shipped code take {wanted} var values and it sends {named}; a "
    "batch sends the var values of each of its programs' calls, in order"
)

# Why a batch's jobs fail without running: (item, message).
Failure = tuple[int, str]
# A batch's device timelines moved by its jobs: (mirrors, their values, jobs of each).
Advances = tuple[list[Signal], list[int], list[list[int]]]


class _BatchSubmission(Submission):
    """The submission of one batch: each job's end is reported to the client as it ends,
    wherever it ran (inline in the reader's task, or on its actor). It makes its jobs
    (`make_jobs`): a profiled batch's carry observers and are kept (`profiled`, by
    slot), so their times and when it came (`received`) go with their reports."""

    __slots__ = (
        "batch_id",
        "batches",
        "blobs",
        "profiled",
        "programs",
        "reads",
        "received",
        "values",
    )

    def __init__(
        self,
        batches: Batches,
        batch_id: int,
        programs: list[Program],
        received: float | None = None,
        advances: Advances = ([], [], []),
        reads: list[list[int]] | None = None,
        blobs: list[list[int]] | None = None,
        values: list[list[int]] | None = None,
    ) -> None:
        timelines, tickets, jobs = advances
        # Mirrors of the client's device timelines that this batch's jobs move as they
        # end (`Batch.advances`), as the client's own submission moves its timelines.
        queue_devices = [[d for d, on in enumerate(jobs) if k in on] for k in range(len(programs))]
        super().__init__(len(programs), timelines, tickets, queue_devices, [len(on) for on in jobs])
        self.batches = batches
        self.batch_id = batch_id
        self.programs = programs
        self.received = received
        self.profiled: list[Job] | None = None
        self.reads = reads or []  # each job's read ids (Batch.reads), checked
        self.blobs = blobs or []  # and blob ids (Batch.blobs)
        self.values = values or []  # and var values (Batch.values)

    def make_jobs(self, bases: list[int]) -> list[Job]:
        """Its jobs, one per program (by slot), relative to `bases`."""
        programs = self.programs
        if self.received is None:
            return [Job(p.script, bases, self, i) for i, p in enumerate(programs)]
        jobs = [Job(p.script, bases, self, i, JobProfile()) for i, p in enumerate(programs)]
        self.profiled = jobs
        return jobs

    def job_done(self, slot: int) -> None:
        self.batches.job_done(self.batch_id, self.programs[slot], self, slot)
        super().job_done(slot)


def read_of(job: Job, index: int) -> int:
    """The read id the batch of `job` (a worker's) names for its host read `index`."""
    sub = job.submission
    assert type(sub) is _BatchSubmission
    return sub.reads[job.slot][index]


def blobs_of(job: Job) -> list[int]:
    """The blob ids the batch of `job` (a worker's) names for its host writes."""
    sub = job.submission
    assert type(sub) is _BatchSubmission
    return sub.blobs[job.slot]


def values_of(job: Job) -> list[int]:
    """The var values the batch of `job` (a worker's) sends for its calls of shipped code."""
    sub = job.submission
    assert type(sub) is _BatchSubmission
    return sub.values[job.slot]


class _Early(NamedTuple):
    """A copy's bytes read ahead from another worker: the read, where they land, and how
    far the client had written to the source when they were asked for (its Fence then):
    if it wrote there since, before it let the copy go on, they may be older than that
    write, and the copy reads them again."""

    read: PeerRead
    staging: bytearray
    fence: int


class Batches:
    """One session's batches: those remembered as checked, those running, and the copies'
    bytes read ahead for them."""

    def __init__(self, session: Session) -> None:
        self.session = session
        # Program ids of batches that passed every check together -> (their programs,
        # the highest base slot they use): see `_seen`.
        self._seen_sets: dict[tuple[int, ...], tuple[tuple[Program, ...], int]] = {}
        # Program id -> the keys of `_seen_sets` it is in, so that a program forgotten
        # takes its sets with it (they hold it, its ops and the views of its buffers).
        self._sets_of: dict[int, list[tuple[int, ...]]] = {}
        self.running: set[Submission] = set()
        self.client_bases: dict[int, list[int]] = {}  # batch id -> the client's bases
        self._early: dict[tuple[int, int], _Early] = {}  # (batch id, item) -> bytes ahead
        self.early_bytes = 0
        # The AWAIT op of a copy from another worker: done at once where its bytes came.
        self.pull_op = Quick(self._pull_now, self._pull)

    def abandon(self) -> None:
        """The client is gone: its running batches fail (their items are skipped)."""
        for sub in list(self.running):
            sub.fail(-1, "worker", ConnectionError("the client went away"))

    def release(self) -> None:
        """The client is gone and its batches failed (`abandon`): forget the programs
        checked together and the bytes read ahead for them."""
        self._seen_sets.clear()
        self._sets_of.clear()
        self.client_bases.clear()
        self._early.clear()
        self.early_bytes = 0

    # -- a batch, as it arrives --

    def run(self, batch: Batch) -> None:
        received = time.perf_counter() if batch.profile else None
        session = self.session
        programs = self._seen(batch)
        error: Failure | None = None
        if programs is None:
            programs, error = self._check(batch)
        if error is None:
            self._check_named(batch, programs)
        session.set_mirrors(batch.ext)
        advances = self._advances(batch, len(programs))
        bases = list(batch.bases)
        if error is None:
            error = self._reserve(programs, bases)
        if error is not None:
            self.drop_blobs(batch)
            for p in programs:
                session.out.send(Done(batch.batch, p.slot, (error[0], "worker", error[1])))
            # Its jobs end here: what waits for them to end may go on.
            for mirror, value in zip(advances[0], advances[1]):
                mirror.set(value)
            return
        self.client_bases[batch.batch] = list(batch.bases)
        peers = session.worker.peers
        peers.hold()  # the batch's reads and watches leave in one send per link
        try:
            self._ask_peers(batch.batch, programs, batch.bases)
        finally:
            peers.release()
        self._start(batch, programs, bases, received, advances)

    @staticmethod
    def _check_named(batch: Batch, programs: list[Program]) -> None:
        """A batch names a read id for each host read of its programs (Batch.reads), the
        blobs their host writes land (Batch.blobs), and sends the var values of their
        calls of shipped code (Batch.values), in order."""
        for named, wanted, rule in (
            (batch.reads, [p.reads for p in programs], _READS_RULE),
            (batch.blobs, [p.blobs for p in programs], _BLOBS_RULE),
            (batch.values, [p.values for p in programs], _VALUES_RULE),
        ):
            counts = [len(ids) for ids in named]
            if (named or any(wanted)) and counts != wanted:
                have = counts if named else "none"
                raise Refused(f"batch {batch.batch}: " + rule.format(wanted=wanted, named=have))

    def drop_blobs(self, batch: Batch) -> None:
        """Let go of the blobs a batch that never runs names."""
        for ids in batch.blobs:
            for blob_id in ids:
                self.session.drop_blob(blob_id)

    def _advances(self, batch: Batch, njobs: int) -> Advances:
        """The mirrors the batch's jobs move as they end (Batch.advances), checked."""
        mirrors, values, jobs = [], [], []
        for ext_id, value, on in batch.advances:
            if not on or any(k >= njobs for k in on):
                raise Refused(
                    f"batch {batch.batch}: a timeline it moves names jobs {on} of {njobs}"
                )
            mirrors.append(self.session.mirror(ext_id))
            values.append(value)
            jobs.append(on)
        return mirrors, values, jobs

    def _seen(self, batch: Batch) -> list[Program] | None:
        """The programs of a batch of kept programs that passed every check together
        before (a replay of a graph: the same programs each time); None for anything
        else, which `_check` then checks in full (and refuses where it must)."""
        seen = self._seen_sets.get(tuple(batch.programs))
        if seen is None or seen[1] >= len(batch.bases):
            return None
        programs = self.session.programs
        for pid, program in zip(batch.programs, seen[0]):
            if programs.get(pid) is not program:
                return None  # forgotten since, or its id given to another program
        return list(seen[0])

    def _check(self, batch: Batch) -> tuple[list[Program], Failure | None]:
        """Check a batch in full: its programs, and the failure its jobs end with (or
        None). A batch that passes, all of its programs kept, is remembered: the same
        programs come again at each replay (`_seen`)."""
        if len(batch.bases) < FIRST_QUEUE_SLOT:
            raise Refused(
                f"batch {batch.batch}: {len(batch.bases)} bases; a batch has KICK and BATCH first"
            )
        kept = self.session.programs
        programs: list[Program] = []
        error: Failure | None = None
        for pid in batch.programs:
            program = kept.get(pid)
            if program is None:
                raise Refused(f"batch {batch.batch}: unknown program id {pid}")
            if not program.store:
                del kept[pid]
            programs.append(program)
            error = error or program.error
        error = error or self._fits(programs, len(batch.bases))
        if error is None and programs and all(p.store for p in programs):
            if len(self._seen_sets) >= self.session.worker.limits.max_programs:
                self._seen_sets.clear()
                self._sets_of.clear()
            highest = max(p.max_slot for p in programs)
            key = tuple(batch.programs)
            self._seen_sets[key] = (tuple(programs), highest)
            for pid in set(key):
                self._sets_of.setdefault(pid, []).append(key)
        return programs, error

    def forget(self, program_id: int) -> None:
        """The program of `program_id` is forgotten (or that id given to another): the
        sets of programs checked together it is in go with it."""
        for key in self._sets_of.pop(program_id, ()):
            self._seen_sets.pop(key, None)

    def _fits(self, programs: list[Program], nbases: int) -> Failure | None:
        """Why the programs cannot run as one batch with `nbases` bases, or None."""
        slots = {p.slot: p for p in programs}
        if len(slots) != len(programs):
            return (-1, "two programs of one batch run on one slot")
        for p in programs:
            if p.max_slot >= nbases:
                return (-1, f"a program uses base slot {p.max_slot} of {nbases}")
            for slot, dev, kind in p.local_waits:
                other = slots.get(slot)
                if other is None or other.actor is not self.session.queue(dev, kind):
                    why = f"a local wait on slot {slot} names no {kind.value} queue of this batch on {dev}"
                    return (-1, why)
        return None

    @staticmethod
    def _reserve(programs: list[Program], bases: list[int]) -> Failure | None:
        """Take each program's timeline values on its actor (its base goes in `bases`), all
        or none: a batch refused because one would pass 2**64-1 leaves every timeline as
        it was, so later batches number their values as if it had never come."""
        taken: list[tuple[QueueActor, int]] = []
        try:
            for p in programs:
                actor = p.queue()
                bases[p.slot] = actor.reserve(p.count)
                taken.append((actor, bases[p.slot]))
        except OverflowError as exc:
            for actor, base in reversed(taken):
                actor.give_back(base)  # nothing was posted
            return (-1, str(exc))
        return None

    def _ask_peers(self, batch_id: int, programs: list[Program], client_bases: list[int]) -> None:
        """Ask other workers for what the batch's jobs wait on: a copy's bytes (read ahead),
        or to be told when a queue gets to a value."""
        session = self.session
        peers = session.worker.peers
        limit = session.worker.limits.max_pending_blob_bytes
        for p in programs:
            for early in p.early:
                # Staging held for reads asked ahead counts like pending host writes;
                # past the limit a copy reads its bytes when it runs.
                if self.early_bytes + early.nbytes > limit:
                    continue
                self.early_bytes += early.nbytes
                value = client_bases[early.slot] + early.rel
                fence = session.fence_of(early.host, early.port, early.session)
                arrived = functools.partial(session.mirror(early.mirror).set, value)
                lost = functools.partial(self.link_lost, batch_id, early.host, early.port)
                read, staging = peers.pull_when(
                    early.host,
                    early.port,
                    early.session,
                    early.src,
                    early.ticket,
                    early.queue,
                    value,
                    early.nbytes,
                    arrived,
                    lost,
                    fence,
                )
                self._early[(batch_id, early.item)] = _Early(read, staging, fence)
        for p in programs:
            pulled = {(e.slot, e.rel, e.mirror) for e in p.early}
            for slot, rel, ext_id, (host, port, sid, queue, ticket) in p.watches:
                value = client_bases[slot] + rel
                mirror = session.mirror(ext_id)
                if mirror.value < value and (slot, rel, ext_id) not in pulled:
                    arrived = functools.partial(mirror.set, value)
                    lost = functools.partial(self.link_lost, batch_id, host, port)
                    peers.watch(host, port, sid, queue, ticket, value, arrived, lost)

    def _start(
        self,
        batch: Batch,
        programs: list[Program],
        bases: list[int],
        received: float | None,
        advances: Advances,
    ) -> None:
        """Post the batch's jobs, or run them here when its queues are idle (never a
        profiled batch's: their actors time them, as a profiled replay's on the client)."""
        session = self.session
        for p in programs:
            p.track(bases[p.slot], batch.bases[p.slot])
        bases[BATCH] = batch.batch  # the id the worker's reports name
        times = session.worker.times
        for p in programs:
            p.recode(times)  # a kernel changed sides since it was coded
        sub = _BatchSubmission(
            self,
            batch.batch,
            programs,
            received,
            advances,
            batch.reads,
            batch.blobs,
            batch.values,
        )
        self.running.add(sub)
        sub.when_done(functools.partial(self._batch_done, batch.batch, programs))
        actors = [p.queue() for p in programs]
        jobs = sub.make_jobs(bases)
        if (
            received is None
            and all(a.idle and a.runs_inline for a in actors)
            and len(set(actors)) == len(actors)
        ):
            # Every queue of the batch is idle: run it here, in the reader's task, as the
            # client runs a replay on idle queues; a job that waits for another worker or
            # the client is held and runs on in the task that moves what it waits on, and
            # one that needs a task (a kernel on the thread, a pull over a new link) goes
            # on to its actor (devices/_inline.py).
            session.worker.resumer.start(InlineRun(actors, jobs, session.broke))
        else:
            for actor, job in zip(actors, jobs):
                actor.post(job)

    def _batch_done(self, batch_id: int, programs: list[Program], sub: Submission) -> None:
        self.running.discard(sub)
        self.client_bases.pop(batch_id, None)
        for p in programs:
            for early in p.early:
                if self._early.pop((batch_id, early.item), None) is not None:
                    self.early_bytes -= early.nbytes

    # -- reports --

    def reached(self, job: Job, slot: int, rel: int, device: str) -> None:
        """A job of a batch got its queue's signal to `rel` past its base."""
        client_bases = self.client_bases.get(job.bases[BATCH])
        if client_bases is not None:
            self.session.progress(device).set(client_bases[slot] + rel)

    def report(self, job: Job, slot: int, rel: int) -> None:
        self.session.out.send(Sig(job.bases[BATCH], slot, rel))

    def job_done(self, batch_id: int, program: Program, sub: _BatchSubmission, slot: int) -> None:
        """A job of a batch ended (ran to its end, or skipped its items after a failure):
        tell the client, with the submission's failure if there is one (and, for a
        profiled batch, the job's times first)."""
        out = self.session.out
        out.hold()  # what the job's end makes due leaves with its report, in one send
        try:
            if sub.profiled is not None and sub.received is not None:
                out.send(_times(batch_id, program, sub.profiled[slot], sub.received))
            client_bases = self.client_bases.get(batch_id)
            if client_bases is not None:
                self.session.progress(program.device).set(
                    client_bases[program.slot] + program.count
                )
            error = None
            if sub.error is not None:
                message = f"{type(sub.error).__name__}: {sub.error}"
                error = (sub.failed_item, sub.failed_actor, message)
            out.send(Done(batch_id, program.slot, error))
        finally:
            out.release()

    def link_lost(self, batch_id: int, host: str, port: int, error: BaseException) -> None:
        """The link to the worker at host:port failed (or refused a watch) before it told
        this one what a job of batch `batch_id` waits for: ask the client to relay those
        waits. It asks that worker itself, over its own connection, and forwards them:
        the job goes on once its source is ready, never before, and never hangs."""
        if batch_id in self.client_bases:  # still running
            self.session.out.send(Relay(batch_id, host, port, str(error)))

    # -- the AWAIT op of a copy from another worker --

    def _pull_now(self, job: Job, item: int, dst: memoryview, *source: object) -> bool:
        """A copy from another worker whose bytes came ahead, as asked: take them now
        (True), or leave it to `_pull` (False, having done nothing)."""
        if job.submission.error is not None:
            return True
        key = (job.bases[BATCH], item)
        early = self._early.get(key)
        if early is None:
            return False
        read, staging, fence = early
        if not read.done.is_set() or read.error is not None:
            return False
        host, port, sid = source[:3]
        if self.session.fence_of(host, port, sid) > fence:  # type: ignore[arg-type]
            return False  # the client wrote there since: `_pull` reads them again
        del self._early[key]
        self.early_bytes -= len(staging)
        dst[:] = staging
        return True

    async def _pull(
        self,
        job: Job,
        item: int,
        dst: memoryview,
        host: str,
        port: int,
        sid: int,
        ref: Ref,
        ticket: bytes,
    ) -> None:
        if job.submission.error is not None:
            return
        peers = self.session.worker.peers
        # What the client had written to the source before it let this copy go on.
        after = self.session.fence_of(host, port, sid)
        early = self._early.pop((job.bases[BATCH], item), None)
        if early is None:
            await peers.pull(host, port, sid, ref, ticket, dst, after)
            return
        read, staging, fence = early
        self.early_bytes -= len(staging)
        if after > fence:
            # The client wrote to the source after these were asked for, and before it
            # let this copy go on: they may be older than that write.
            await peers.pull(host, port, sid, ref, ticket, dst, after)
            return
        await read.done.wait()
        if isinstance(read.error, PeerRefusedError):
            raise ConnectionError(str(read.error))
        if read.error is not None:
            # The link failed before the bytes came (the client relayed the wait this
            # copy follows): read them now, over a new link, or fail naming it.
            await peers.pull(host, port, sid, ref, ticket, dst, after)
            return
        dst[:] = staging


def _times(batch_id: int, program: Program, job: Job, received: float) -> JobTimes:
    """A profiled job's times, on this worker's `time.perf_counter`, each span named by
    the program entry its op runs (ops of the worker's own are left out)."""
    observer = job.observer
    assert observer is not None  # a profiled batch's jobs all carry one
    now = time.perf_counter()
    clock = program.queue().clock
    # An actor with a clock of its own (SIM's is trio's): put its times on perf_counter.
    shift = 0.0 if clock is time.perf_counter else now - clock()
    entries = program.entries_of(job.script)
    spans: dict[int, tuple[float, float]] = {}
    for index, start, end in observer.spans:
        entry = entries[index] if index < len(entries) else -1
        if entry < 0:
            continue
        got = spans.get(entry)
        if got is not None:  # an entry run as several ops: one span over them all
            start, end = min(start, got[0]), max(end, got[1])
        spans[entry] = (start, end)
    return JobTimes(
        batch_id,
        program.slot,
        received,
        now,
        None if observer.start is None else observer.start + shift,
        None if observer.end is None else observer.end + shift,
        [(entry, s + shift, e + shift) for entry, (s, e) in sorted(spans.items())],
    )
