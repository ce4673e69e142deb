"""Stop signals: SIGTERM (a scheduler's preemption or time limit) and SIGUSR1 (sbatch --signal)
ask a training run to stop. Every rank checkpoints after the same step and the process exits
with ``PREEMPTED_EXIT_CODE`` (sysexits' EX_TEMPFAIL: try again later); running the same command
again resumes exactly.

``python -m hvdtrack.train`` is inside ``PENDING`` from its first line, before the dataset and
TensorFlow, so that a signal that comes before the first step is kept for it instead of killing
the rank (the default action of both signals). No TensorFlow here: this runs before anything
forks.
"""

from __future__ import annotations

import signal
import threading
from typing import Optional

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
PREEMPTED_EXIT_CODE = 75


class StopSignals:
    """Turns ``STOP_SIGNALS`` into a flag (``received``: the signal's name) that the training
    loop reads at each step, while entered (main thread only; elsewhere it catches nothing)."""

    def __init__(self):
        self.received: Optional[str] = None
        self._previous: dict = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        self.received = self.received or PENDING.received  # one that came before
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


#: Entered by ``python -m hvdtrack.train`` for its whole run (``hvdtrack.train.__main__``).
PENDING = StopSignals()
