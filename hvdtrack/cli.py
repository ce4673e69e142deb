"""The ``hvdtrack`` command: ``hvdtrack prepare|train|scaling|bench ...`` and the shared error guard."""

from __future__ import annotations

import os
import sys
from typing import Callable, Sequence

USAGE = """usage: hvdtrack COMMAND [ARGS]

commands:
  prepare   events (synthetic or TrackML CSV) -> hit graphs -> TFRecord shards + manifest
  train     train the segment classifier (local, horovod, mirrored or multiworker)
  evaluate  score a split with a trained run's best (or latest) checkpoint
  scaling   run a strong/weak scaling sweep, or report on run directories
  bench     benchmarks: construct, read, model, distributed

`hvdtrack COMMAND --help` describes each command."""


def quiet_tensorflow() -> None:
    """Hides TensorFlow's C++ INFO banner; must run before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def guarded(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Runs an entry point; a user error prints one clear line and returns its exit code."""
    from hvdtrack.errors import HvdtrackError

    try:
        return main(argv)
    except HvdtrackError as err:
        print(f"hvdtrack: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    except KeyboardInterrupt:
        print("hvdtrack: interrupted", file=sys.stderr)
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    quiet_tensorflow()
    if command == "prepare":
        from hvdtrack.prepare import main as entry
    elif command == "train":
        from hvdtrack.train.__main__ import main as entry
    elif command == "evaluate":
        from hvdtrack.train.inference import main as entry
    elif command == "scaling":
        from hvdtrack.scaling.__main__ import main as entry
    elif command == "bench":
        from hvdtrack.bench.__main__ import main as entry
    else:
        print(f"hvdtrack: error: unknown command '{command}'\n\n{USAGE}", file=sys.stderr)
        return 2
    return guarded(entry, rest)


if __name__ == "__main__":
    sys.exit(main())
