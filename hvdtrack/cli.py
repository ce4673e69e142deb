"""The ``hvdtrack`` command: ``hvdtrack prepare|train|evaluate|reconstruct|export|scaling|bench``.

It imports only the chosen command's module, after that command's settings are applied
(``hvdtrack.entry``); each module owns its ``main`` and runs alone as ``python -m MODULE``.
"""

from __future__ import annotations

import importlib
import sys
from typing import Mapping, NamedTuple, Optional, Sequence

from hvdtrack import entry


class Command(NamedTuple):
    module: str  # its ``main(argv) -> int`` is the command
    summary: str
    settings: Mapping[str, str] = entry.TRAINING


COMMANDS = {
    "prepare": Command(
        "hvdtrack.prepare.__main__",
        "events (synthetic or TrackML CSV) -> hit graphs -> TFRecord shards + manifest",
    ),
    "train": Command(
        "hvdtrack.train.__main__",
        "train the segment classifier (local, horovod, mirrored or multiworker)",
    ),
    "evaluate": Command(
        "hvdtrack.evaluate.__main__",
        "a trained run on a split: edge metrics, tracks, TrackML score, plots",
    ),
    "reconstruct": Command(
        "hvdtrack.reconstruct.__main__",
        "a trained run on any TrackML events (no truth needed): tracks, submissions",
    ),
    "export": Command(
        "hvdtrack.export.__main__",
        "a trained run's classifier as a TensorFlow SavedModel (serving signature)",
    ),
    "scaling": Command(
        "hvdtrack.scaling.__main__",
        "run a strong/weak scaling sweep, or report on run directories",
    ),
    # The model bench applies training's settings (its allocator) itself.
    "bench": Command(
        "hvdtrack.bench.__main__",
        "benchmarks: construct, read, model, distributed, stages",
        entry.QUIET,
    ),
}

USAGE = (
    "usage: hvdtrack COMMAND [ARGS]\n\ncommands:\n"
    + "\n".join(f"  {name:<11} {c.summary}" for name, c in COMMANDS.items())
    + "\n\n`hvdtrack COMMAND --help` describes each command."
)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    command = COMMANDS.get(name)
    if command is None:
        print(f"hvdtrack: error: unknown command '{name}'\n\n{USAGE}", file=sys.stderr)
        return 2

    def command_main(args: Optional[Sequence[str]]) -> int:
        return importlib.import_module(command.module).main(args)

    return entry.run(command_main, rest, command.settings)


if __name__ == "__main__":
    sys.exit(main())
