"""The SQLite store's threads: the one thread that owns the connection and runs every statement, by priority,
and the checkpointer; with the guards that keep SQLite from faulting on a damaged `-shm` file and the lock that
keeps a second process out."""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from bot.storage.interface import StoreSide, StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

# Order in which work waiting for the store thread runs: an acknowledge waits for nothing else.
_URGENT, _HEALTH, _BACKGROUND, _LAST = 0, 1, 2, 3
_CHECKPOINT_EVERY = 1.0
_WAL_SIZE_CHECK_EVERY = 0.1
# Past this size the checkpointer copies the whole WAL and truncates it (and a WAL restarted by SQLite is cut
# back to it): writers that never pause starve passive checkpoints, and the WAL would otherwise grow over the
# whole disk, leaving nothing for the database file once space is freed (the store would never recover).
_WAL_LIMIT_BYTES = 16 * 1024 * 1024


class StoreInUse(StoreUnavailable):
    """Another process has this store open: two bots on one SQLite file would process every event twice."""


class _ShmGuard:
    """SQLite maps the WAL's `-shm` index file into memory. Once that file is truncated, or made unwritable
    (`chattr +i`, a read-only remount), SQLite's next touch of the mapping gets SIGBUS: the process dies (exit
    135) with nothing logged. Checked before each use of the connection, the file's state becomes a
    StoreUnavailable instead: webhooks get 503, /readyz says why, the log says it, the process lives.

    A change landing between this check and SQLite's access (within one store call, milliseconds) is not
    caught: keeping the index in heap memory (locking_mode=EXCLUSIVE) would close that gap, but would also shut
    out every other reader of the store (`gpu-alert-bot gpus` beside a running bot).
    """

    def __init__(self, *databases: Path) -> None:
        """Guards the index of each of `databases` (the main file and the inbox: every connection reads both)."""
        self._lock = threading.Lock()  # the store's thread and the checkpointers share one guard
        self._largest = {shm: _size(shm) for shm in (d.with_name(d.name + "-shm") for d in databases)}

    def check(self) -> None:
        for shm in self._largest:
            self._check(shm)

    def _check(self, shm: Path) -> None:
        size = _size(shm)
        if size < 0:
            return
        with self._lock:
            if size < self._largest[shm]:
                raise StoreUnavailable(
                    f"{shm} shrank from {self._largest[shm]} to {size} bytes while in use: restart the bot"
                )
            self._largest[shm] = size
        if not os.access(shm, os.W_OK):
            raise StoreUnavailable(f"{shm} is not writable (read-only or immutable): make it writable again")


def _size(shm: Path) -> int:
    try:
        return shm.stat().st_size
    except FileNotFoundError:
        return -1  # removed while mapped: the mapping keeps the old file, nothing faults


# The lock file of each side (StoreSide): one ingest and one worker per store, in one process or in two.
LOCK_SUFFIXES: dict[StoreSide, tuple[str, ...]] = {
    "all": (".ingest.lock", ".lock"),
    "ingest": (".ingest.lock",),
    "worker": (".lock",),
}


def _lock_exclusively(store: Path, suffix: str) -> int:
    """Hold an exclusive lock on the store for the life of the process; the kernel drops it when the process
    dies, even by SIGKILL, so a crash never leaves a stale lock behind."""
    fd = os.open(store.with_name(store.name + suffix), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreInUse(f"the store {store} is in use by another gpu-alert-bot process") from None
    return fd


def lock_held(store: Path, suffix: str) -> bool:
    """Whether a process holds the lock `_lock_exclusively` takes (tried and let go at once, never created)."""
    try:
        fd = os.open(store.with_name(store.name + suffix), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing lets go of the lock too
    return False


class _StoreThread:
    """The one thread that owns the connection. Unlike a one-worker ThreadPoolExecutor it takes work by
    priority, so a webhook's write never queues behind the worker's and the outbox's statements."""

    def __init__(self) -> None:
        self._queue: queue.PriorityQueue[tuple[int, int, Callable[[], Any] | None, Future[Any] | None]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="sqlite-store", daemon=True)
        self._thread.start()

    def submit(self, priority: int, fn: Callable[[], T]) -> Future[T]:
        if self._closed:
            raise RuntimeError("the store thread is shut down")
        future: Future[T] = Future()
        self._queue.put((priority, next(self._order), fn, future))
        return future

    def _serve(self) -> None:
        while True:
            _, _, fn, future = self._queue.get()
            if fn is None or future is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Finish what was submitted, then stop."""
        if not self._closed:
            self._closed = True
            self._queue.put((_LAST, next(self._order), None, None))
        self._thread.join()


class _Checkpointer:
    """Copies the WAL into the database file from a connection and a thread of its own, every second.

    Left to SQLite, the commit that pushes the WAL past its threshold does the copy and its fsync, and that
    commit may be a webhook's. A passive checkpoint on another connection never blocks the writer. `housekeeping`,
    when given, runs on that connection before each passive checkpoint.
    """

    def __init__(self, path: Path, housekeeping: Callable[[sqlite3.Connection], None] | None = None) -> None:
        self._path = path
        self._housekeeping = housekeeping
        self._wal = path.with_name(path.name + "-wal")
        self.shm_guard: _ShmGuard | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        checks_per_checkpoint = round(_CHECKPOINT_EVERY / _WAL_SIZE_CHECK_EVERY)
        try:
            for tick in itertools.count(1):
                if self._stop.wait(_WAL_SIZE_CHECK_EVERY):
                    return
                try:
                    self._checkpoint(conn, passive=tick % checks_per_checkpoint == 0)
                except (sqlite3.Error, OSError, StoreUnavailable) as exc:  # the writer reports that already
                    log.debug("checkpoint failed", extra={"reason": str(exc)})
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection, *, passive: bool) -> None:
        if self.shm_guard is not None:
            self.shm_guard.check()
        if passive:
            if self._housekeeping is not None:
                self._housekeeping(conn)
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        if self._wal.exists() and self._wal.stat().st_size > self._wal_limit():
            # Waits for the writer of the moment, then holds writers off while it copies: a rare, bounded pause.
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def _wal_limit(self) -> int:
        """The WAL may take half the disk's free space at most: a backlog drained right after a full disk was
        freed writes megabytes a second, and a WAL that took all the space back would leave none for the
        checkpoint that copies it into the database file; the disk would be full for good."""
        disk = os.statvfs(self._path.parent)
        return min(_WAL_LIMIT_BYTES, disk.f_bavail * disk.f_frsize // 2)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
