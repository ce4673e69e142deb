"""Atomic file output: write to a temporary sibling, then rename, so no reader sees half a file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO[Any]]:
    """Opens a temporary file beside ``path``; renames it to ``path`` only if the block succeeds.

    Args:
      path: the final file name.
      mode: ``"w"`` (text) or ``"wb"`` (binary).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    ordinary_permissions(tmp)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def ordinary_permissions(path: str | os.PathLike, directory: bool = False) -> None:
    """Gives a file made by mkstemp/mkdtemp (0600/0700) the mode open()/mkdir() would give it
    (0666/0777 less the umask), so collaborators on a shared filesystem can read the results."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Writes ``data`` as indented JSON, atomically."""
    with atomic_write(path) as f:
        json.dump(data, f, indent=2, sort_keys=False, default=_json_default)
        f.write("\n")


def _json_default(value: Any) -> Any:
    # numpy scalars and arrays show up in reports; json cannot serialise them itself.
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")
