"""How every command starts and ends: process settings first, then one guard for user errors.

Every entry point (``hvdtrack COMMAND`` and each ``python -m hvdtrack.X``) ends with
``sys.exit(run(main))``; nothing is set by importing a module of the package.

Public symbols: ``QUIET``, ``TRAINING``, ``ALLOCATOR``, ``start``, ``choose_allocator``,
``allocator_in_use``, ``run``.
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
    # A memory-first model (model.recompute) runs the system allocator (``choose_allocator``).
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


def choose_allocator(
    memory_first: bool, environ: Optional[MutableMapping[str, str]] = None
) -> None:
    """TensorFlow's CPU allocator for a process that trains a model, once its configuration is
    read and before TensorFlow starts (a value the user set wins).

    The caching (BFC) allocator (``TRAINING``) unless the model is ``memory_first``
    (``ModelConfig.memory_first``: ``model.recompute`` without ``model.keep_edge_term``). The
    caching allocator keeps every block it once held, and where its blocks fall varies: at a
    million edges, recomputed, its peak resident set was 4.17-4.18 GiB in one run and 3.83-3.94
    GiB in another, against 3.66-3.93 GiB with the system allocator, which returns large blocks
    on free. The system allocator gives every large tensor fresh pages instead, faulted in at
    every step: 130-220 thousand page faults a step at 160,000 edges, where the recomputed step
    with the kept edge term took 1.36-1.54x the plain step with it and 1.21-1.31x with the
    caching allocator (one thread), and 25.6-29.1 against 22.3-23.9 s a step at a million
    edges (``docs/performance.md``, "The recomputed step's allocator"). So memory first means
    the system allocator, and ``keep_edge_term``, which spends memory for speed, keeps the
    caching one."""
    start({ALLOCATOR: "false" if memory_first else "true"}, environ)


def allocator_in_use(environ: Optional[Mapping[str, str]] = None) -> str:
    """TensorFlow's CPU allocator as ``ALLOCATOR`` sets it: "caching" for "true" or "1" (any
    case, as TensorFlow reads it), else "system" (unset, or a value TensorFlow refuses)."""
    value = (os.environ if environ is None else environ).get(ALLOCATOR, "")
    return "caching" if value.lower() in ("true", "1") else "system"


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
