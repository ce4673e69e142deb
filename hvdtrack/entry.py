"""How every command starts and ends: process settings first, then one guard for user errors.

Every entry point (``hvdtrack COMMAND`` and each ``python -m hvdtrack.X``) ends with
``sys.exit(run(main))``; nothing is set by importing a module of the package.

Public symbols: ``QUIET``, ``TRAINING``, ``ALLOCATOR``, ``start``, ``choose_allocator``, ``run``.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Mapping, MutableMapping, Optional, Sequence

from hvdtrack.errors import HvdtrackError

# TensorFlow reads these when it starts (the log level at import, the allocator when it first
# makes a CPU device), so a command applies them before it imports TensorFlow. An explicit
# setting in the environment wins.
ALLOCATOR = "TF_CPU_ALLOCATOR_USE_BFC"  # TensorFlow's caching (BFC) CPU allocator: true/false
QUIET: Mapping[str, str] = {
    # TensorFlow prints INFO banners from C++ at import; keep warnings and errors.
    "TF_CPP_MIN_LOG_LEVEL": "1",
}
TRAINING: Mapping[str, str] = {
    **QUIET,
    # The default CPU allocator returns large buffers to the OS after every step; with graphs of
    # ~10^5 edges that costs ~10^6 page faults per step (a third of it). The caching (BFC)
    # allocator keeps them: 1.3-1.6x faster steps (measured when the bench still compared both).
    # With model.recompute the system allocator instead (``choose_allocator``).
    ALLOCATOR: "true",
    # Same seed, same weights: with TensorFlow's oneDNN kernels a process of a 2-rank job
    # computed one of two different gradients for the same batch and weights (the kernels' order
    # varies from process to process), so repeated runs parted. Without them every process
    # agreed; the step costs ~12% more CPU time (docs/results.md). Set it to 1 for speed.
    "TF_ENABLE_ONEDNN_OPTS": "0",
}

# The names of the settings in the environment that a command supplied, not its user: a child
# process (a memory probe, a rank) may still choose them for itself.
SUPPLIED = "HVDTRACK_SUPPLIED_SETTINGS"

Main = Callable[[Optional[Sequence[str]]], int]


def start(settings: Mapping[str, str], environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Applies a command's process settings: environment defaults; values the user set win,
    values an hvdtrack command supplied (``SUPPLIED``, in a parent process) do not."""
    environ = os.environ if environ is None else environ
    supplied = set(filter(None, environ.get(SUPPLIED, "").split(",")))
    for name, value in settings.items():
        if name not in environ or name in supplied:
            environ[name] = value
            supplied.add(name)
    if supplied:
        environ[SUPPLIED] = ",".join(sorted(supplied))


def choose_allocator(recompute: bool, environ: Optional[MutableMapping[str, str]] = None) -> None:
    """TensorFlow's CPU allocator for a process that trains a model, once its configuration is
    read and before TensorFlow starts (a value the user set wins).

    The plain step keeps the caching (BFC) allocator (``TRAINING``). With ``model.recompute``
    memory comes first: the caching allocator keeps every block it once held, and its
    fragmentation kept 400-500 MiB beyond the live tensors at a million edges (4.21-4.34 GiB
    peak resident set against 3.84-3.95 GiB with the system allocator, which returns large
    blocks on free), at the same step time there on one thread; about 5% slower at 160,000
    edges, and 1.41x slower on two threads at 1.14M edges, where every step faults in its large
    buffers afresh (``docs/performance.md``): set ``TF_CPU_ALLOCATOR_USE_BFC=true`` for speed
    when the graph fits that way."""
    start({ALLOCATOR: "false" if recompute else "true"}, environ)


def run(
    main: Main, argv: Optional[Sequence[str]] = None, settings: Mapping[str, str] = TRAINING
) -> int:
    """Starts a command: applies ``settings``, then calls ``main(argv)``.

    Returns:
      ``main``'s exit code; for an ``HvdtrackError`` the error's ``exit_code`` after printing
      one line (``hvdtrack: error: ...``, no traceback); 130 on Ctrl-C.
    """
    start(settings)
    try:
        return main(argv)
    except HvdtrackError as err:
        print(f"hvdtrack: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    except KeyboardInterrupt:
        print("hvdtrack: interrupted", file=sys.stderr, flush=True)
        return 130
