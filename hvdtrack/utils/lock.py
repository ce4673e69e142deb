"""One writer per directory: an exclusive advisory lock file naming its holder.

``DirectoryLock`` takes ``flock(LOCK_EX | LOCK_NB)`` on a lock file and writes the holder into it
(host, pid, command, since). A second writer is refused at once, naming the holder. The lock ends
with its process (the kernel releases a flock on exit, also after kill -9); a lock file whose
flock is free but that still names a holder was left by a process that is gone: on this host it
is taken over with a message, a holder on another host is refused (on a filesystem whose locks
are node-local - Lustre mounted with ``localflock``, NFS with ``local_lock`` - a free flock does
not prove that holder gone). Where flock is not supported at all (Lustre without ``flock``) the
lock file's record is the only lock: it is created exclusively, and a record of a live holder
refuses.

A lock taken for a job (``job``: an elastic Horovod job's rendezvous) may be taken over by
another process of the same job, on any host, once its flock is free: the job's driver has
dropped the worker that held it (its host lost, say) and the job's new chief writes on. Without
that, the chief's lock would stay with a dead host and refuse every later run of the same
command. ``acquire(wait_s=...)`` waits that long for a held lock to be released (a partitioned
old chief ends at its collectives' deadline) before refusing.

flock works on local filesystems, NFSv4 (the client maps it to a byte-range lock the server
holds) and Lustre mounted with ``-o flock``. Readers take no lock.

Public symbols: ``DirectoryLock``, ``DirectoryBusy``, ``Holder``.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from hvdtrack.errors import HvdtrackError

NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL)


class DirectoryBusy(HvdtrackError):
    """Another process holds the directory's lock. The message names it."""


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds (or held) a lock, as its lock file records it."""

    host: str
    pid: int
    command: str
    since: str
    job: str = ""  # the job the holder belongs to ("" outside an elastic job)

    @classmethod
    def me(cls, job: str = "") -> Holder:
        command = " ".join([os.path.basename(sys.executable), *sys.argv])[:500]
        when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        return cls(socket.gethostname(), os.getpid(), command, when, job)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} ({self.command!r}, since {self.since})"

    def gone(self) -> bool:
        """True when the holder ran on this host and its process no longer exists."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def read_holder(text: str) -> Holder | None:
    """The holder a lock file's text records; None for an empty or unreadable record."""
    try:
        record = json.loads(text)
        return Holder(
            str(record["host"]),
            int(record["pid"]),
            str(record["command"]),
            str(record["since"]),
            str(record.get("job", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None


class DirectoryLock:
    """An exclusive lock on ``path`` (the lock file) for the writer of ``directory``.

    ::

        with DirectoryLock(run_dir / ".hvdtrack.lock", run_dir, "train.run_dir"):
            ...  # write run_dir

    Args:
      path: the lock file (created, and removed on release).
      directory: what the lock guards, for the messages.
      key: the setting that names ``directory``, for the message of a refused writer.
      job: the job this writer belongs to: a free lock of the same job is taken over on any host.

    Raises (on entering):
      DirectoryBusy: another process holds it.
      OSError: the lock file cannot be written (a read-only or full filesystem).
    """

    def __init__(
        self,
        path: Path,
        directory: Path,
        key: str,
        say: Optional[Callable[[str], None]] = None,
        job: str = "",
    ):
        self.path, self.directory, self.key, self.job = Path(path), Path(directory), key, job
        self.say = say or _say
        self.fd: int | None = None
        self.flocked = False  # False where the filesystem has no flock
        self.written = False  # the lock file holds this process's record (removed on release)
        self.took_over: Holder | None = None  # a stale holder this lock replaced

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def acquire(self, wait_s: float = 0.0) -> None:
        """Takes the lock; a lock held by another process is waited for ``wait_s`` seconds
        (polled), then refused."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self._acquire()
            except DirectoryBusy:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def _acquire(self) -> None:
        for _ in range(10):  # another process may remove the file between open and flock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                if self._lock(fd):
                    self.fd, fd = fd, None
                    break
            finally:
                if fd is not None:
                    os.close(fd)
        else:
            raise DirectoryBusy(f"{self.path}: could not take the lock (it kept being replaced)")
        try:
            self._claim()
        except BaseException:
            self.release()
            raise

    def _lock(self, fd: int) -> bool:
        """Takes the flock on ``fd``; False when the file was replaced meanwhile (retry)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.flocked = True
        except BlockingIOError:
            self._refuse(read_holder(_read(fd)), None)
        except OSError as err:
            if err.errno not in NO_FLOCK:
                raise
            # No flock here: the record is the lock (see the module's docstring).
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    def _claim(self) -> None:
        """Writes this process into the lock file, after checking what it recorded before."""
        previous = read_holder(_read(self.fd))
        if previous is not None and (previous.host, previous.pid) != (
            socket.gethostname(),
            os.getpid(),
        ):
            here = previous.host == socket.gethostname()
            # On this host a free flock proves the holder gone (its pid may be reused since);
            # in one job, the job's driver dropped it (see the module's docstring).
            ours = bool(self.job) and previous.job == self.job
            if not ours and (not here or not (self.flocked or previous.gone())):
                self._refuse(previous, "its lock file remains")
            self.took_over = previous
            why = "a worker this job dropped" if ours and not here else "which is gone"
            self.say(f"{self.directory}: taking over the lock of {previous.describe()}, {why}")
        me = Holder.me(self.job)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, (json.dumps(dataclasses.asdict(me)) + "\n").encode(), 0)
        os.fsync(self.fd)
        self.written = True

    def _refuse(self, holder: Holder | None, note: str | None) -> None:
        who = holder.describe() if holder else "another process (its record is not written yet)"
        stale = ""
        if note:
            stale = f"; {note} but its lock is free: if that process is gone, remove {self.path}"
        raise DirectoryBusy(
            f"{self.directory} is being written by {who}{stale}. Wait for it to end, or use "
            f"another {self.key}"
        )

    def release(self) -> None:
        """Removes the lock file (if still this lock's), then releases the lock."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        written, self.written = self.written, False
        try:
            ours = written or not _read(fd).strip()  # an empty record: a write that failed
            if ours and os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                os.unlink(self.path)
        except OSError:
            pass  # a read-only or vanished file: the flock still ends with the close
        finally:
            os.close(fd)


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode(errors="replace")
    except OSError:
        return ""


def _say(message: str) -> None:
    print(f"hvdtrack: {message}", file=sys.stderr, flush=True)
