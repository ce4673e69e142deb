"""Atomic file output: write beside the final name, then rename, so no reader sees half a file.

``Staged`` is the one mechanism: temporaries (files or directories) made beside their final
names and renamed into place together. ``atomic_write`` (one file, fsynced) and ``write_json``
are built on it; the shard writer stages a dataset's shards with it, prepare a whole dataset
directory. ``write_json`` writes strict JSON: a non-finite float (an empty bin's efficiency) is
null, never ``NaN`` or ``Infinity``, which jq and JavaScript's JSON.parse refuse.

Temporaries are named ``.NAME.HOST-PID-XXXX.tmp`` (a replaced directory moved aside
``.NAME.old-HOST-PID``), so ``remove_stale_temps`` can tell those of a dead writer.

Public symbols: ``Staged``, ``atomic_write``, ``write_json``, ``json_ready``,
``ordinary_permissions``, ``remove_stale_temps``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator


class Staged:
    """Files or directories written beside their final names, then renamed into place together.

    ::

        with Staged() as staged:
            tmp = staged.path(out_dir / "train-00000-of-00002.tfrecord")  # an empty file
            ...                                  # write tmp (and more staged paths)
            staged.commit()                      # every temporary renamed to its final name

    Leaving the block without ``commit()`` (an exception) removes the temporaries; a commit that
    fails part-way removes what it had already renamed into place. A staged directory replaces
    an existing one: the old directory is moved aside, then removed (or moved back if the
    rename fails). Temporaries are hidden (``.NAME.HOST-PID-XXXX.tmp``) and get ordinary
    permissions.
    """

    def __init__(self) -> None:
        self._pairs: list[tuple[Path, Path]] = []

    def path(self, final: str | os.PathLike, directory: bool = False) -> Path:
        """A new empty temporary file (or directory) beside ``final``, renamed to it on commit."""
        final = Path(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        prefix = f".{final.name}.{_owner()}-"  # the writer, for ``remove_stale_temps``
        if directory:
            tmp = tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=final.parent)
        else:
            fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=final.parent)
            os.close(fd)
        ordinary_permissions(tmp, directory)
        self._pairs.append((Path(tmp), final))
        return Path(tmp)

    def commit(self) -> list[Path]:
        """Renames every temporary to its final name, in the order staged; returns the finals."""
        done: list[Path] = []
        try:
            for tmp, final in self._pairs:
                _replace(tmp, final)
                done.append(final)
        except BaseException:
            _remove(done)
            raise
        finally:
            self.discard()
        return done

    def discard(self) -> None:
        """Removes the temporaries not renamed yet."""
        pairs, self._pairs = self._pairs, []
        _remove(tmp for tmp, _ in pairs)

    def __enter__(self) -> Staged:
        return self

    def __exit__(self, *exc_info) -> None:
        self.discard()


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO[Any]]:
    """Opens a temporary file beside ``path``; renames it to ``path`` only if the block succeeds.

    The data is fsynced before the rename, so after a crash ``path`` is the old or the new file.

    Args:
      path: the final file name.
      mode: ``"w"`` (text) or ``"wb"`` (binary).
    """
    with Staged() as staged:
        with open(staged.path(path), mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        staged.commit()


def ordinary_permissions(path: str | os.PathLike, directory: bool = False) -> None:
    """Gives a file made by mkstemp/mkdtemp (0600/0700) the mode open()/mkdir() would give it
    (0666/0777 less the umask), so collaborators on a shared filesystem can read the results."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Writes ``data`` as indented strict JSON (``json_ready``), atomically."""
    with atomic_write(path) as f:
        json.dump(json_ready(data), f, indent=2, sort_keys=False, allow_nan=False)
        f.write("\n")


def json_ready(value: Any) -> Any:
    """``value`` as strict JSON can hold it: non-finite floats become None (null), numpy scalars
    and arrays Python numbers and lists, tuples lists; dicts and lists are converted throughout."""
    if isinstance(value, float):  # numpy's float64 too
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalars and arrays show up in reports
        return json_ready(value.tolist())
    return value


def _replace(tmp: Path, final: Path) -> None:
    if not (tmp.is_dir() and final.exists()):
        os.replace(tmp, final)
        return
    # rename() cannot replace a non-empty directory: move the old one aside first.
    old = final.with_name(f".{final.name}.old-{_owner()}")
    final.rename(old)
    try:
        tmp.rename(final)
    except BaseException:
        old.rename(final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _owner() -> str:
    """This process as temporary names carry it: ``HOST-PID``."""
    return f"{socket.gethostname()}-{os.getpid()}"


def remove_stale_temps(final: str | os.PathLike) -> list[Path]:
    """Removes what a ``Staged`` of ``final`` left behind when its process died (a signal,
    kill -9): its temporaries and an old directory moved aside, if written by a process of this
    host that no longer runs. Nothing else is touched. An old directory whose final name is
    gone (the process died between the two renames) is moved back instead. Returns what was
    removed or moved back."""
    final = Path(final)
    pattern = re.compile(
        rf"^\.{re.escape(final.name)}\.(?:(?P<host>.+)-(?P<pid>\d+)-\w+\.tmp"
        rf"|old-(?P<old_host>.+)-(?P<old_pid>\d+))$"
    )
    host, found = socket.gethostname(), []
    with contextlib.suppress(OSError):
        for path in final.parent.iterdir():
            match = pattern.match(path.name)
            if match is None or (match["host"] or match["old_host"]) != host:
                continue
            if _running(int(match["pid"] or match["old_pid"])):
                continue
            if match["old_pid"] and not os.path.lexists(final):
                path.rename(final)
            else:
                _remove([path])
            found.append(path)
    return found


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove(paths) -> None:
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
