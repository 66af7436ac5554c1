"""The group-commit writer: the store's only user while the daemon runs (its own thread).

The loop queues what it processed (:meth:`Writer.put`: a record, or nothing for a SYNC, with
the connection and sequence number to acknowledge) and the sampler its samples; the writer
takes whatever is queued, up to :data:`WRITER_BATCH` records, commits it in one transaction,
and only then hands the sequence numbers back (:meth:`Writer.take_acks`, after waking the
loop), which acknowledges them to the clients: acknowledged means durable. A transaction takes
the users' records in turn (:func:`fair_batch`): one user's backlog does not delay another's
records by more than a transaction. A commit that fails
(e.g. disk full) is retried and nothing is acknowledged meanwhile. A record the store cannot
hold (any other error of its transaction) is found by committing the batch's records one by
one and refused to its client (:meth:`Writer.take_refusals`), with the reason; the others are
committed and acknowledged. Nothing a client sends ends the writer's thread: an unexpected
error is logged with its traceback and the loop goes on. Rows older than the retention are
pruned every :data:`PRUNE_EVERY_S`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from counterd.daemon.metrics_state import Workload
from counterd.daemon.quota import Usage
from counterd.daemon.store import ClientClock, RunAnchor, RunInfo, Sample, Store
from counterd.data.clocks import ANCHOR_PERIOD_S, Anchor, take_anchor
from counterd.data.errors import StoreError
from counterd.data.records import SuperstepRecord

if TYPE_CHECKING:
    from counterd.daemon.metrics_state import MetricsState

log = logging.getLogger("counterd.daemon")

WRITER_BATCH = 2048  # records per transaction at most
WRITER_BATCH_BYTES = 16 << 20  # and their wire bytes (at least one record)
PRUNE_EVERY_S = 3600.0
MAX_ANCHORED_RUNS = 65536  # runs whose clocks the writer keeps anchoring (the latest declared)


@dataclass
class Item:
    """A processed frame: the record to commit (None for a SYNC) and the sequence number to
    acknowledge on connection ``cid`` once it is committed (cid 0: nobody to acknowledge);
    ``size``: its wire bytes (what it costs in flight, :class:`~counterd.daemon.quota.Usage`).
    """

    cid: int
    seq: int
    record: SuperstepRecord | None
    info: RunInfo | None
    size: int = 0


_STOP = object()


class Writer:
    """``start(store)`` runs the writer thread; ``stop()`` has it commit what is queued, close
    the store and end. ``wake`` tells the loop acknowledgements are ready; ``stopping`` is set
    when the daemon shuts down (a commit that keeps failing is then given up)."""

    def __init__(self, state: MetricsState, *, wake: Callable[[], None],
                 stopping: threading.Event) -> None:
        self.state = state
        self._wake = wake
        self._stopping = stopping
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._acks: dict[int, int] = {}
        self._refusals: dict[int, list[tuple[int, str]]] = {}
        self._acks_lock = threading.Lock()
        self._retention: tuple[int | None, float] = (None, 0.0)  # ns (None: keep), days
        self.usage = Usage()
        # (uid, run id) -> its client's clock and when it was last anchored (monotonic s):
        # the writer's thread only
        self._clocks: dict[tuple[int, str], tuple[ClientClock, float]] = {}

    def set_retention(self, retention_ns: int | None, retention_days: float) -> None:
        self._retention = (retention_ns, retention_days)

    def put(self, item: Item) -> None:
        if item.info is not None:
            self.usage.queued(item.info.uid, item.size)
        self._queue.put(item)

    def put_samples(self, rows: list[Sample]) -> None:
        self._queue.put(rows)

    def anchor(self, uid: int, run_id: str, clock: ClientClock,
               taken: Anchor | None = None) -> None:
        """Anchor run ``(uid, run_id)``'s clocks now, or with the anchor ``taken`` (when its
        client connected), and every ANCHOR_PERIOD_S while its records are committed
        (counterd.data.clocks)."""
        self._queue.put(RunAnchor(uid, run_id, taken or take_anchor(), clock))

    def stop(self) -> None:
        self._queue.put(_STOP)

    def take_acks(self) -> dict[int, int]:
        """connection id -> the highest committed sequence number, since the last call."""
        with self._acks_lock:
            acks, self._acks = self._acks, {}
        return acks

    def take_refusals(self) -> dict[int, list[tuple[int, str]]]:
        """connection id -> (sequence number, reason) of the records the store refused, since
        the last call (the loop sends them before the acknowledgements that follow them)."""
        with self._acks_lock:
            refusals, self._refusals = self._refusals, {}
        return refusals

    def start(self, store: Store) -> threading.Thread:
        self.usage.load(store.usage())
        self.usage.stat(store.path.parent)
        thread = threading.Thread(target=self._run, args=(store,), name="counterd-writer",
                                  daemon=True)
        thread.start()
        return thread

    def _run(self, store: Store) -> None:
        next_prune = 0.0
        stopping = False
        pending: dict[int, deque[Item]] = {}  # uid -> its items queued, in order
        while not stopping or pending:
            samples: list[Sample] = []
            anchors: list[RunAnchor] = []
            try:
                item: Any = self._queue.get_nowait() if pending else \
                    self._queue.get(timeout=0.5)
            except queue.Empty:
                item = None
            while item is not None:  # all that is queued (Usage bounds it per uid)
                if item is _STOP:
                    stopping = True
                elif isinstance(item, Item):
                    pending.setdefault(item.info.uid if item.info is not None else -1,
                                       deque()).append(item)
                elif isinstance(item, RunAnchor):
                    anchors.append(item)
                    self._anchored(item)
                else:
                    samples.extend(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = None
            batch = fair_batch(pending)
            anchors += self._due(batch)
            if batch or samples or anchors:
                try:
                    self._commit(store, batch, samples, anchors)
                except Exception:  # a bug, not a client's doing: log it, keep the thread
                    log.exception("the writer could not commit %d records and %d samples",
                                  len(batch), len(samples))
            retention_ns, retention_days = self._retention
            if time.monotonic() >= next_prune and retention_ns:
                next_prune = time.monotonic() + PRUNE_EVERY_S
                try:
                    n = store.prune(retention_ns)
                    if n:
                        log.info("retention: deleted %d rows older than %g days", n,
                                 retention_days)
                        self.usage.load(store.usage())
                except Exception as exc:
                    log.error("retention failed: %s", exc)
        store.close()

    def _anchored(self, a: RunAnchor) -> None:
        key = (a.uid, a.run_id)
        self._clocks.pop(key, None)  # re-inserted last: the dict's order is the eviction's
        self._clocks[key] = (a.clock, time.monotonic())
        while len(self._clocks) > MAX_ANCHORED_RUNS:
            del self._clocks[next(iter(self._clocks))]

    def _due(self, batch: list[Item]) -> list[RunAnchor]:
        """Anchors of the batch's runs last anchored ANCHOR_PERIOD_S ago or more."""
        due: list[RunAnchor] = []
        now = time.monotonic()
        seen: set[tuple[int, str]] = set()
        for it in batch:
            if it.record is None or it.info is None \
                    or (it.info.uid, it.record.run_id) in seen:
                continue
            seen.add((it.info.uid, it.record.run_id))
            known = self._clocks.get((it.info.uid, it.record.run_id))
            if known is not None and now - known[1] >= ANCHOR_PERIOD_S:
                a = RunAnchor(it.info.uid, it.record.run_id, take_anchor(), known[0])
                self._anchored(a)
                due.append(a)
        return due

    def _commit(self, store: Store, batch: list[Item], samples: list[Sample],
                anchors: list[RunAnchor] | None = None) -> None:
        t0 = time.perf_counter()
        anchors = anchors or []
        try:
            committed = self._commit_retrying(store, batch, samples, anchors)
        except _GaveUp:
            self._settled(store, batch)
            return
        except Exception as exc:  # some record the store cannot hold: find it, keep the rest
            log.warning("the store refused a batch (%s: %s); committing its records one by "
                        "one", type(exc).__name__, exc)
            committed = self._commit_each(store, batch, samples, anchors)
        elapsed = time.perf_counter() - t0
        try:
            self.state.observe_records([(it.record, Workload(it.info.uid, it.info.job,
                                                             it.info.batch_job))
                                        for it in committed
                                        if it.record is not None and it.info is not None],
                                       elapsed)
        except Exception:
            log.exception("metrics of %d committed records not updated", len(committed))
        acks: dict[int, int] = {}
        for it in batch:
            if it.cid and it.seq > acks.get(it.cid, 0):
                acks[it.cid] = it.seq
        if acks:
            with self._acks_lock:
                for cid, seq in acks.items():
                    self._acks[cid] = max(seq, self._acks.get(cid, 0))
        self._settled(store, batch)
        self._wake()  # acknowledgements, and uids no longer congested (Usage.congested)

    def _settled(self, store: Store, batch: list[Item]) -> None:
        """The batch's records are no longer in flight: the store's bytes of their uids and
        its free space are read again (:class:`~counterd.daemon.quota.Usage`)."""
        uids = set()
        for it in batch:
            if it.info is not None:
                self.usage.done(it.info.uid, it.size)
                uids.add(it.info.uid)
        if uids:
            try:
                self.usage.committed(store.usage(uids))
            except Exception as exc:  # the quota goes on from the last counts
                log.warning("cannot read the store's usage: %s", exc)
        self.usage.stat(store.path.parent)

    def _commit_retrying(self, store: Store, batch: list[Item], samples: list[Sample],
                         anchors: list[RunAnchor] | None = None) -> list[Item]:
        """Commit everything, retrying a StoreError (disk full); :class:`_GaveUp` at
        shutdown, any other error as the store raised it."""
        records = [(it.record, it.info) for it in batch
                   if it.record is not None and it.info is not None]
        delay = 0.1
        while True:
            try:
                store.commit(records, samples, anchors or ())
                return batch
            except StoreError as exc:  # e.g. disk full: nothing is acknowledged; retry
                log.error("%s; retrying in %.1f s (clients are not acknowledged)", exc, delay)
                if self._stopping.is_set() and delay > 5:
                    log.error("giving up on %d records at shutdown", len(records))
                    raise _GaveUp from exc
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _commit_each(self, store: Store, batch: list[Item], samples: list[Sample],
                     anchors: list[RunAnchor] | None = None) -> list[Item]:
        """Commit the samples and anchors, then each item alone; refuse the items the store
        refuses. Returns the items committed (a SYNC is one)."""
        committed: list[Item] = []
        refused: dict[int, list[tuple[int, str]]] = {}
        for items, rows in [([], samples)] + [([it], []) for it in batch]:
            try:
                self._commit_retrying(store, items, rows, anchors if not items else None)
                committed.extend(items)
            except _GaveUp:
                return committed
            except Exception as exc:
                for it in items:
                    log.warning("refused a record of run %s (connection %d, frame %d): %s",
                                it.record.run_id if it.record else "-", it.cid, it.seq, exc)
                    self.state.count("refused", "store")
                    if it.cid:
                        refused.setdefault(it.cid, []).append(
                            (it.seq, f"the store cannot hold this record ({exc})"))
                if not items:
                    log.error("%d samples not stored: %s", len(rows), exc)
        if refused:
            with self._acks_lock:
                for cid, rows_ in refused.items():
                    self._refusals.setdefault(cid, []).extend(rows_)
        return committed


def fair_batch(pending: dict[int, deque[Item]], max_items: int = WRITER_BATCH,
               max_bytes: int = WRITER_BATCH_BYTES) -> list[Item]:
    """The next transaction's items, taken off ``pending`` (uid -> items in order): one of
    each uid in turn, up to ``max_items`` and ``max_bytes`` (at least one item). A record of
    a user who sends few goes into the next transaction, however many another has queued;
    each uid's (so each connection's) items keep their order."""
    batch: list[Item] = []
    size = 0
    while pending:
        for uid in list(pending):
            items = pending[uid]
            it = items.popleft()
            batch.append(it)
            size += it.size
            if not items:
                del pending[uid]
            if len(batch) >= max_items or size >= max_bytes:
                return batch
    return batch


class _GaveUp(Exception):
    """A commit given up at shutdown (the disk stayed full)."""
