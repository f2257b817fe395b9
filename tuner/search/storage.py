"""Optuna storage and the claim protocol of shared studies: the plumbing under the search.

Several workers (processes, machines) may run one study at once. Optuna gives each trial
a number at ask time but has no compare-and-set, so this module decides, from what each
worker can see, which trials it may measure (`claim`), names every RUNNING trial after its
worker so that one left behind by a dead process can be failed and its config queued again
(`fail_stale`), records Optuna's heartbeats while a batch is measured (`Heartbeat`), closes
trials another worker may have finished first (`close_trial`), and opens storages
(`open_storage`): a journal file, the default of a local run (`JournalFile`: one appended
line per operation, no database layer between a trial and the disk), or a database for
fleets, which several processes may create at once.

Optuna's private API it reaches through tuner/search/optuna_private.py, as every module does.

Trial user attributes written here and by the search (tuner/search/runner.py):
  worker    "host:pid/boot/start" of the process that asked for the trial (tuner/search/owners.py)
  config    the launch config it measures (absent on trials pruned before one was chosen)
  error     why a measured config failed (FAIL trials); "interrupted" when its worker died
  failure   the kind of that failure (tuner/measure/failures.py)
  pruned    why a trial was not measured ("repeat" of another worker's claim, "pending
            repeat", "over budget", a space rule's name)
  repeat    the measured config a proposal repeated (the trial is told its time)
  seed      where a queued config came from ("default", "baseline", "requeued", ...)
"""

from __future__ import annotations

import collections
import datetime
import errno
import fcntl
import inspect
import json
import logging
import os
import sqlite3
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import optuna
import sqlalchemy
from optuna.storages import BaseStorage
from optuna.storages.journal import BaseJournalBackend
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import TunerError
from tuner.plan.kernel_api import Config
from tuner.search.journal_lines import (  # noqa: F401 (is_journal: the name callers know)
    LONGEST_LINE,
    OPERATION_START,
    end_of_line,
    is_journal,
    looks_like_operation,
    torn_tail_start,
)
from tuner.search.optuna_private import journal_backend, study_storage, trial_id, trial_of
from tuner.search.owners import owner_id, process_gone, same_process
from tuner.search.settings import JOURNAL

log = logging.getLogger("tuner")

# Who measures a trial: host, process and that process's identity (boot, start time:
# tuner/search/owners.py), so that a restarted run can tell at once which RUNNING trials belong
# to a process that no longer exists on this host, whatever process has its pid now.
WORKER_ID = owner_id()
ACTIVE_TRIALS: set[int] = set()      # trial ids this process is measuring right now
# A live worker names itself on a trial and gives it a config (or prunes it) within moments
# of asking for it; a RUNNING trial still unnamed or without a config after this long was
# asked for by a process that died in between.
ORPHAN_AFTER_S = 300
# Unnamed trials (asked, the next write not yet done) are not failed that early, but after
# this long they stop holding a budget slot for the trials asked after them.
UNNAMED_GRACE_S = 20
SCHEMA_RACE_RETRIES = 5
# What SQLite and PostgreSQL say when another process created the same tables first.
SCHEMA_RACE_MESSAGES = ("already exists", "alembic_version", "unique constraint", "duplicate key")

ConfigKey = Callable[[Config], tuple]     # a config as the hashable tuple studies compare


def worker_gone(worker: str | None, tid: int, asked: datetime.datetime | None = None) -> bool:
    """The process named `worker` no longer measures trial `tid` (asked at `asked`): it is a
    process of this host that has exited or whose pid another process has now
    (tuner/search/owners.py), or this process, which is not measuring it."""
    if not isinstance(worker, str) or not worker:
        return False
    if same_process(worker):
        return tid not in ACTIVE_TRIALS
    return bool(process_gone(worker, asked))     # None: another machine's, Optuna's heartbeat decides


def close_trial(study: optuna.Study, trial: optuna.Trial, state: TrialState | None = None,
                value: float | None = None, **attrs) -> bool:
    """Write a trial's attributes, then tell it. False when another worker finished it
    first: with SQLite two workers can both pop one queued trial, and two can fail the same
    dead worker's trial at once; the first to finish it stands."""
    try:
        for key, v in attrs.items():
            trial.set_user_attr(key, v)
        if value is not None:
            study.tell(trial, value)
        else:
            study.tell(trial, state=state)
        return True
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    except ValueError:
        # tell() refuses a trial that is no longer RUNNING: read its present state back
        if study_storage(study).get_trial(trial_id(trial)).state.is_finished():
            return False
        raise


def counts(tr: FrozenTrial) -> bool:
    """A finished trial that measured something (not pruned, not interrupted): it takes
    one unit of the budget."""
    return ("config" in tr.user_attrs and tr.user_attrs.get("error") != "interrupted"
            and (tr.state == TrialState.COMPLETE
                 or (tr.state == TrialState.FAIL and "error" in tr.user_attrs)))


def heartbeat_enabled(storage: BaseStorage) -> bool:
    return getattr(storage, "get_heartbeat_interval", lambda: None)() is not None


class Heartbeat:
    """Records Optuna heartbeats for the trials being measured (RDB storages with a
    heartbeat interval), so other workers can fail them if this machine dies."""

    def __init__(self, storage: BaseStorage, trial_ids: Iterable[int]):
        # record_heartbeat and get_heartbeat_interval live on RDBStorage's heartbeat mixin,
        # not on BaseStorage; heartbeat_enabled() says whether this storage has them
        self.storage: Any = storage
        self.ids = list(trial_ids)
        self.enabled = heartbeat_enabled(storage)
        self._stop = threading.Event()

    def _beat(self) -> None:
        interval = self.storage.get_heartbeat_interval() or 30
        while not self._stop.wait(interval):
            for tid in self.ids:
                try:
                    self.storage.record_heartbeat(tid)
                except Exception:  # noqa: BLE001 - a missed beat is retried next interval
                    log.debug("heartbeat of trial %s missed; retried in %ss", tid, interval)

    def __enter__(self) -> "Heartbeat":
        if self.enabled:
            for tid in self.ids:
                self.storage.record_heartbeat(tid)
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join(5)


def measuring(storage: BaseStorage, batch: list[tuple[optuna.Trial, Config]]):
    """While a batch is measured: its trials are this process's (so a restart of the
    search in this process does not take them for a dead worker's) and beat."""
    return _Measuring(storage, {trial_id(t) for t, _ in batch})


class _Measuring:
    def __init__(self, storage: BaseStorage, ids: set[int]):
        self.ids, self.heartbeat = ids, Heartbeat(storage, ids)

    def __enter__(self) -> "_Measuring":
        ACTIVE_TRIALS.update(self.ids)
        try:
            self.heartbeat.__enter__()
        except BaseException:
            ACTIVE_TRIALS.difference_update(self.ids)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.heartbeat.__exit__(*exc)
        finally:
            ACTIVE_TRIALS.difference_update(self.ids)


def abandoned(tr: FrozenTrial, now: datetime.datetime, unnamed_after_s: float) -> bool:
    """A RUNNING trial nobody will finish: its process is gone, or it was never named
    (after `unnamed_after_s`) or never given a config long after it was asked for."""
    worker = tr.user_attrs.get("worker")
    age = (now - tr.datetime_start).total_seconds() if tr.datetime_start is not None else 0.0
    if worker is None:
        return age > unnamed_after_s
    if "config" not in tr.user_attrs and age > ORPHAN_AFTER_S:
        return True
    return worker_gone(worker, trial_id(tr), tr.datetime_start)


def claim(study: optuna.Study, batch: list[tuple[optuna.Trial, Config]], budget: int,
          key: ConfigKey) -> tuple[list[tuple[optuna.Trial, Config]], bool]:
    """Keep the trials this worker may measure. Workers ask and write concurrently and
    Optuna has no compare-and-set, so each decides from what it can see, conservatively:
    - a config another trial already holds (measured, or claimed and running) is a
      repeat. Of two claims of one config, the later-written one always sees the other,
      so at most one is measured (rarely both step back; the config stays unmeasured);
    - trials count against the budget in number order, and a lower-numbered trial that
      is still being set up (asked, config not yet written) counts as taking a slot: a
      number is given at ask time, so every trial that could be kept ahead of this one
      is already visible (an unnamed one only for UNNAMED_GRACE_S, so that a process
      killed right after asking does not hold a slot for long). Budget that stays
      unused is filled in the next round. Returns (kept, whether some waited for a slot)."""
    if not batch:
        return batch, False
    mine = {tr.number: (tr, cfg) for tr, cfg in batch}
    now = datetime.datetime.now()
    holders: list[tuple[int, tuple | None]] = []     # (number, config tuple or None)
    still_running = set()
    for tr in study.get_trials(deepcopy=False):
        if tr.number in mine and tr.state == TrialState.RUNNING:
            still_running.add(tr.number)    # (not if another worker finished it meanwhile)
        cfg = tr.user_attrs.get("config")
        if counts(tr):                      # counted trials always carry their config
            holders.append((tr.number, key(tr.user_attrs["config"])))
        elif tr.state != TrialState.RUNNING or "pruned" in tr.user_attrs:
            continue
        elif cfg:
            holders.append((tr.number, key(cfg)))
        elif not abandoned(tr, now, UNNAMED_GRACE_S):
            holders.append((tr.number, None))
    holders.sort()
    held = collections.Counter(t for _, t in holders)    # my own trial is one of them
    kept, waiting = [], False
    for rank, (number, t) in enumerate(holders):
        if number not in mine:
            continue
        trial, cfg = mine[number]
        reason = "repeat" if held[t] > 1 else "over budget" if rank >= budget else None
        if reason:
            close_trial(study, trial, TrialState.PRUNED, pruned=reason)
            waiting |= reason == "over budget"
        elif number in still_running:
            kept.append((trial, cfg))
    return kept, waiting


def fail_stale(study: optuna.Study, requeue: Callable[[Config], None]) -> None:
    """Trials left RUNNING by a worker that is gone are failed as 'interrupted' and their
    configs queued again (`requeue`): at once for a dead process on this host, after
    Optuna's heartbeat grace period for one elsewhere."""
    now = datetime.datetime.now()
    for tr in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if abandoned(tr, now, ORPHAN_AFTER_S):
            stale = trial_of(study, trial_id(tr))
            if not close_trial(study, stale, TrialState.FAIL, error="interrupted"):
                continue                  # another worker got there first and requeues it
            log.info("trial %d of %s was left running by %s: failed as interrupted%s", tr.number,
                     study.study_name, tr.user_attrs.get("worker", "an unnamed worker"),
                     ", its config queued again" if tr.user_attrs.get("config") else "")
            if tr.user_attrs.get("config"):
                requeue(tr.user_attrs["config"])
    # Trials of workers on other machines whose heartbeat stopped (a no-op for storages
    # without one); Optuna requeues them through requeue_stale_trial.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def requeue_stale_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Optuna's heartbeat callback: a trial whose worker stopped beating is measured again."""
    if trial.params:
        study.enqueue_trial(trial.params, user_attrs={"seed": "requeued"})


def _sqlite_pragmas(dbapi_connection, connection_record) -> None:
    """Every SQLite connection: write-ahead log, synced at checkpoints only. A commit is then
    one write to the log and no fsync: what a killed process committed is in the file (the
    kernel holds it), so kill -9 loses nothing; only a power cut may lose the last
    commits, never the database's consistency. Where the file system cannot do WAL (some
    network file systems), SQLite keeps its rollback journal and syncs as before."""
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return
    cursor = dbapi_connection.cursor()
    try:
        mode = cursor.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode and str(mode[0]).lower() == "wal":
            cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


# -- the journal file: the default storage of a local run ------------------------------------
# JOURNAL (journal:///FILE) is defined in tuner/search/settings.py, where a plan reads it

JOURNAL_SYNC_S = 1.0         # the journal is synced to the disk at most this long after a write
JOURNAL_MAX_LINE = LONGEST_LINE  # a line longer than this is no operation of ours (tuner/search/journal_lines.py)


def journal_path(url: str) -> Path | None:
    """The file of a journal URL (None for any other URL)."""
    return Path(url[len(JOURNAL):]) if url.startswith(JOURNAL) else None


class JournalFile(BaseJournalBackend):
    """Optuna's journal (JournalStorage: every storage operation one JSON line, the studies
    rebuilt in memory from them) in one local file, for processes on one host.

    Why not Optuna's JournalFileBackend: it syncs the file to the disk on every operation
    (a dozen per trial) and a writer killed in the middle of a line leaves it there, so the
    next line appended after it makes the journal unreadable. Here:
    - a writer holds an flock on the file while it appends (the kernel releases it when the
      process dies, kill -9 included: no stale lock to wait out), and appends each operation
      with one write(2);
    - what a killed writer left without its newline is cut off by the next writer, under the
      lock, however long it is, and never a complete line; readers take complete lines only,
      so none ever saw it. A tail that is not the beginning of an operation was left by no
      writer of ours: the file is refused in one line and left as it is;
    - readers stream the file a line at a time (a line over JOURNAL_MAX_LINE is no operation
      of ours and is skipped), so neither a long journal nor a long torn tail takes memory;
    - the file is synced (fdatasync) when a write comes JOURNAL_SYNC_S or more after the last
      sync, and when the storage is closed: a killed process loses nothing it wrote (the
      kernel holds it), a power cut at most the last second, never the journal's order.
    A line that does not parse (what a power cut can leave, never a writer of ours) is
    skipped by every reader alike, with a warning."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        self._offsets = {0: 0}       # line number -> byte offset of that line, where known
        self._synced = time.monotonic()
        self._unsynced = False
        self._warned: set[int] = set()

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        # where the records read so far end (every record's end is kept; else from the start)
        number = log_number_from if log_number_from in self._offsets else 0
        offset = self._offsets[number]
        # Streamed line by line, each at most JOURNAL_MAX_LINE: a journal of any length, or a
        # torn tail of any length, never takes more memory than one line.
        with open(self.path, "rb") as f:
            f.seek(offset)
            while True:
                line = f.readline(JOURNAL_MAX_LINE + 1)
                if not line.endswith(b"\n"):
                    if len(line) <= JOURNAL_MAX_LINE:
                        return                 # complete lines only: the rest is being written
                    stop = end_of_line(f)     # a line too long to be one of ours: skipped whole
                    if stop is None:
                        return
                    self._skip(offset, number, stop, "is longer than any record")
                    offset = stop
                    continue
                stop = offset + len(line)
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):
                    self._skip(offset, number, stop, "is not a whole record (a power cut?)")
                    offset = stop
                    continue
                number, offset = number + 1, stop
                self._offsets[number] = stop
                if number > log_number_from:
                    yield record

    def _skip(self, offset: int, number: int, stop: int, why: str) -> None:
        """A line no reader takes: warned about once, and read past by every reader alike."""
        if offset not in self._warned:
            self._warned.add(offset)
            log.warning("journal %s: the line at byte %d %s; skipped", self.path, offset, why)
        self._offsets[number] = stop

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = "".join(json.dumps(entry, separators=(",", ":")) + "\n" for entry in logs).encode()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND)     # read: the last byte, to find a torn line
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                size = self._cut_torn_line(fd, size)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except BaseException:
                os.ftruncate(fd, size)      # a full disk (or an interrupt) leaves no part of a line
                raise
            self._unsynced = True
            if time.monotonic() - self._synced >= JOURNAL_SYNC_S:
                self._sync(fd)
        finally:
            os.close(fd)                    # releases the lock

    def _cut_torn_line(self, fd: int, size: int) -> int:
        """The file ends in part of a line (its writer was killed mid-write): cut that part
        off, however long, and nothing before it. A tail that is no beginning of an operation
        of ours was not left by a writer of ours: refused, the file left as it is."""
        keep = torn_tail_start(fd, size)
        if not looks_like_operation(os.pread(fd, len(OPERATION_START) + 1, keep)):
            raise TunerError(f"journal {self.path} ends in {size - keep} bytes that are no operation of a tuner "
                             "journal: not a journal this tool wrote (nothing was changed); give another --storage")
        log.info("journal %s: cut %d bytes a killed writer left mid-line", self.path, size - keep)
        os.ftruncate(fd, keep)
        return keep

    def _sync(self, fd: int) -> None:
        os.fdatasync(fd)
        self._synced, self._unsynced = time.monotonic(), False

    def sync(self) -> None:
        """Sync what this process wrote to the disk (at the end of a run)."""
        if self._unsynced:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                self._sync(fd)
            finally:
                os.close(fd)


def open_journal(path: Path) -> BaseStorage:
    try:
        return optuna.storages.JournalStorage(JournalFile(path))
    except (KeyError, ValueError, TypeError, AttributeError, AssertionError, RuntimeError) as e:
        # an operation that parses but that Optuna cannot replay (an unknown op_code, a field missing or
        # of another type): said, with the repair that keeps the operations before it
        from tuner.search.journal_repair import unreplayable_line
        raise TunerError(unreplayable_line(Path(path), e)) from None


def sync_storage(storage: BaseStorage) -> None:
    """Sync a journal's last writes to the disk (databases sync their own)."""
    backend = journal_backend(storage)
    if isinstance(backend, JournalFile):
        try:
            backend.sync()
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise


def open_storage(url: str) -> BaseStorage:
    """An Optuna storage for a URL: journal:///FILE (the default of a local run), or a
    database. Databases get Optuna's heartbeat, so that workers on other machines can take
    over the trials of one that died."""
    path = journal_path(url)
    if path is not None:
        return open_journal(path)
    if url.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql"):
        kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        if url.startswith("sqlite") and not sqlalchemy.event.contains(sqlalchemy.engine.Engine, "connect", _sqlite_pragmas):
            sqlalchemy.event.listen(sqlalchemy.engine.Engine, "connect", _sqlite_pragmas)
        # Optuna 4.9 renamed the stale-trial callback argument.
        callback = ("heartbeat_stale_trial_callback"
                    if "heartbeat_stale_trial_callback" in inspect.signature(optuna.storages.RDBStorage).parameters
                    else "failed_trial_callback")
        for attempt in range(SCHEMA_RACE_RETRIES + 1):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=20,
                                                      grace_period=90,
                                                      **{callback: requeue_stale_trial})  # type: ignore[arg-type]  # name differs by Optuna version
            except Exception as e:  # noqa: BLE001 - sqlalchemy's errors differ by database
                # Processes opening a fresh database at once all create its tables (and
                # Optuna's schema-version row); the losers find them there on the next try.
                if not any(m in str(e).lower() for m in SCHEMA_RACE_MESSAGES) or attempt == SCHEMA_RACE_RETRIES:
                    raise
                log.debug("storage %s: another process is creating its tables; retrying", url)
                time.sleep(0.2 * (attempt + 1))
    return optuna.storages.get_storage(url)
