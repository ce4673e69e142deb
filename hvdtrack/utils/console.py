"""Console output that stays readable in SLURM/horovodrun logs: rank-aware logging and progress."""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any, Callable, TextIO

LOGGER_NAME = "hvdtrack"
DEFAULT_INTERVAL_S = 30.0
# Python loggers of libraries whose warnings every rank repeats (tf.function retracing,
# deprecations, tf.data notices); on non-chief ranks only their errors are kept.
LIBRARY_LOGGERS = ("tensorflow", "absl")

Clock = Callable[[], float]


# ------------------------------------------------------------------------------------- logging


class _Formatter(logging.Formatter):
    """``PREFIX message``; warnings and worse also name their level; every line carries PREFIX."""

    def __init__(self, prefix: str):
        super().__init__("%(message)s")
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname}: {text}"
        return "\n".join(f"{self.prefix} {line}" for line in text.splitlines() or [""])


class _ConsoleHandler(logging.StreamHandler):
    """The one handler ``setup_logging`` installs (recognised on later calls)."""


def setup_logging(
    rank: int, is_chief: bool, stream: TextIO | None = None, *, quiet_libraries: bool = True
) -> logging.Logger:
    """Configures and returns the ``hvdtrack`` logger for this rank.

    The chief logs INFO and above as ``[hvdtrack] message`` (warnings as
    ``[hvdtrack] WARNING: message``); other ranks log WARNING and above only, as
    ``[hvdtrack rank 3] WARNING: message``, so their lines can be told apart even without
    ``srun --label``. Every line of a multi-line message (or traceback) carries the prefix. Each
    record is flushed as soon as it is written. Calling again reconfigures the same handler
    (rank, level, stream): it replaces its own handler instead of adding a second one.

    Args:
      rank: This process's global rank.
      is_chief: Whether this process is the chief (rank 0), which reports progress.
      stream: Where lines go; ``sys.stderr`` (as of this call) by default.
      quiet_libraries: On non-chief ranks, raise the ``tensorflow`` and ``absl`` Python loggers
        to ERROR: their warnings repeat the chief's once per rank. The chief's are untouched.

    Returns:
      The ``hvdtrack`` logger (it does not propagate to the root logger).
    """
    logger = logging.getLogger(LOGGER_NAME)
    for old in [h for h in logger.handlers if isinstance(h, _ConsoleHandler)]:
        logger.removeHandler(old)  # not closed: its stream (sys.stderr) is not ours to close
    handler = _ConsoleHandler(stream or sys.stderr)
    logger.addHandler(handler)
    handler.setFormatter(_Formatter("[hvdtrack]" if is_chief else f"[hvdtrack rank {rank}]"))
    logger.setLevel(logging.INFO if is_chief else logging.WARNING)
    logger.propagate = False
    if quiet_libraries and not is_chief:
        for name in LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
    return logger


# ------------------------------------------------------------------------------------ progress


def format_eta(seconds: float) -> str:
    """``H:MM:SS`` (hours unbounded), rounded to the second; ``?`` if unknown.

    Args:
      seconds: Remaining time; NaN, infinite or negative means unknown.

    Returns:
      For example ``0:00:07``, ``1:02:05``, ``26:00:00``.
    """
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


class _Pace:
    """When the next plain line is due, and the remaining time at the observed rate."""

    def __init__(self, clock: Clock, interval: float, initial: int):
        self.clock = clock
        self.interval = interval
        self.start = (clock(), initial)
        self.last_line = self.start[0]
        # Rates are measured from the first update on: the first step includes tf.function
        # tracing (seconds to minutes) and would inflate every later estimate.
        self.first: tuple[float, int] | None = None

    def observe(self, done: int) -> float:
        """Records ``done`` units finished; returns the current time."""
        now = self.clock()
        if self.first is None:
            self.first = (now, done)
        return now

    def due(self, now: float) -> bool:
        if now - self.last_line < self.interval:
            return False
        self.last_line = now
        return True

    def rate(self, now: float, done: int) -> float:
        """Units per second (NaN before any measurable progress)."""
        since, base = self.first if self.first and done > self.first[1] else self.start
        if done <= base or now <= since:
            return math.nan
        return (done - base) / (now - since)

    def eta(self, now: float, done: int, total: int) -> str:
        rate = self.rate(now, done)
        return format_eta((total - done) / rate if rate > 0 else math.nan)


class NullProgress:
    """The reporter of non-chief ranks (or with progress disabled): does nothing."""

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Ignores its arguments."""

    def close(self) -> None:
        """Does nothing."""


class BarProgress:
    """A tqdm bar of one epoch with loss and edges/s, for a terminal."""

    def __init__(
        self,
        total: int,
        initial: int,
        epoch: int,
        epochs: int | None = None,
        *,
        stream: TextIO | None = None,
    ):
        """Starts the bar (see ``progress`` for the arguments)."""
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            initial=initial,
            desc=f"epoch {_epoch_text(epoch, epochs)}",
            unit="step",
            dynamic_ncols=True,
            leave=False,
            file=stream or sys.stderr,
            mininterval=1.0,
        )

    def update(self, step: int, loss: float, edges_per_s: float) -> None:
        """Moves the bar to ``step + 1`` steps done and shows loss and edges/s."""
        self.bar.set_postfix(loss=f"{loss:.4f}", edges_s=f"{edges_per_s:,.0f}", refresh=False)
        self.bar.update(step + 1 - self.bar.n)

    def close(self) -> None:
        """Removes the bar (``leave=False``)."""
        self.bar.close()


class LineProgress:
    """Plain progress lines of one epoch for logs: no carriage returns, one line per interval.

    A line looks like ``[hvdtrack] epoch 3/24 step 12/20 loss 0.1234 edges/s 15,321 eta 0:00:07``
    and is written when ``interval`` seconds have passed since the previous line (or the start),
    so short epochs print nothing: the epoch summary line follows anyway. The epoch's last step
    prints nothing for the same reason. The ETA uses the rate since the first update (which
    excludes the first step and its tf.function tracing) once there is one.
    """

    def __init__(
        self,
        total: int,
        initial: int,
        epoch: int,
        epochs: int | None = None,
        *,
        stream: TextIO | None = None,
        interval: float = DEFAULT_INTERVAL_S,
        clock: Clock = time.monotonic,
    ):
        """Starts timing (see ``progress`` for the arguments)."""
        self.total = total
        self.epoch = _epoch_text(epoch, epochs)
        self.stream = stream or sys.stderr
        self.pace = _Pace(clock, interval, initial)

    def update(self, step: int, loss: float, edges_per_s: float) -> None:
        """Records that step ``step`` (0-based) finished; writes a line if one is due."""
        done = step + 1
        now = self.pace.observe(done)
        if done >= self.total or not self.pace.due(now):
            return
        self.stream.write(
            f"[hvdtrack] epoch {self.epoch} step {done}/{self.total} loss {loss:.4f} "
            f"edges/s {edges_per_s:,.0f} eta {self.pace.eta(now, done, self.total)}\n"
        )
        self.stream.flush()

    def close(self) -> None:
        """Nothing to undo: every line is already complete."""


def _epoch_text(epoch: int, epochs: int | None) -> str:
    return f"{epoch + 1}/{epochs}" if epochs else f"{epoch + 1}"


def progress(
    enabled: bool,
    total: int,
    initial: int,
    epoch: int,
    epochs: int | None = None,
    *,
    stream: TextIO | None = None,
    interval: float = DEFAULT_INTERVAL_S,
    clock: Clock = time.monotonic,
) -> NullProgress | BarProgress | LineProgress:
    """The progress reporter of one epoch: a bar on a terminal, plain lines otherwise.

    Args:
      enabled: True on the chief with progress wanted; otherwise the reporter does nothing.
      total: Steps in the epoch.
      initial: Steps already done (a resumed epoch starts there).
      epoch: The epoch's 0-based index (shown 1-based, as in ``epoch_line``).
      epochs: Total epochs, shown as ``epoch 3/24`` if given.
      stream: Where to write; ``sys.stderr`` by default. ``stream.isatty()`` picks the kind.
      interval: Seconds between plain lines (not used for the bar).
      clock: Time source of the plain lines, in seconds.

    Returns:
      An object with ``update(step, loss, edges_per_s)`` (``step``: 0-based index of the step
      just finished) and ``close()``.
    """
    if not enabled:
        return NullProgress()
    stream = stream or sys.stderr
    if _isatty(stream):
        return BarProgress(total, initial, epoch, epochs, stream=stream)
    return LineProgress(
        total, initial, epoch, epochs, stream=stream, interval=interval, clock=clock
    )


class CountBar:
    """A tqdm bar counting work items (``hvdtrack prepare``), for a terminal."""

    def __init__(self, total: int, label: str, unit: str, *, stream: TextIO | None = None):
        """Starts the bar (see ``counter`` for the arguments)."""
        from tqdm import tqdm

        self.bar = tqdm(
            total=total, desc=label, unit=unit, file=stream or sys.stderr, dynamic_ncols=True
        )

    def update(self, n: int = 1) -> None:
        """Counts ``n`` more items."""
        self.bar.update(n)

    def close(self) -> None:
        """Ends the bar."""
        self.bar.close()


class CountLines:
    """Plain counting lines, e.g. ``[prepare] 40/600 events 7.4 events/s eta 0:01:16``.

    One line per ``interval`` seconds; none for the last item (a summary follows it).
    """

    def __init__(
        self,
        total: int,
        label: str,
        unit: str,
        *,
        stream: TextIO | None = None,
        interval: float = DEFAULT_INTERVAL_S,
        clock: Clock = time.monotonic,
    ):
        """Starts timing (see ``counter`` for the arguments)."""
        self.total, self.label, self.unit = total, label, unit
        self.stream = stream or sys.stderr
        self.done = 0
        self.pace = _Pace(clock, interval, 0)
        self.pace.first = self.pace.start  # every item counts towards the rate

    def update(self, n: int = 1) -> None:
        """Counts ``n`` more items; writes a line if one is due."""
        self.done += n
        now = self.pace.observe(self.done)
        if self.done >= self.total or not self.pace.due(now):
            return
        rate = self.pace.rate(now, self.done)
        self.stream.write(
            f"[{self.label}] {self.done}/{self.total} {self.unit}s {rate:,.1f} {self.unit}s/s "
            f"eta {self.pace.eta(now, self.done, self.total)}\n"
        )
        self.stream.flush()

    def close(self) -> None:
        """Nothing to undo: every line is already complete."""


def counter(
    enabled: bool,
    total: int,
    label: str,
    unit: str,
    *,
    stream: TextIO | None = None,
    interval: float = DEFAULT_INTERVAL_S,
    clock: Clock = time.monotonic,
) -> NullProgress | CountBar | CountLines:
    """A counter of work items: a bar on a terminal, plain lines otherwise, nothing if disabled.

    Args:
      enabled: Whether to show progress at all.
      total: Items to process.
      label: Shown first (``prepare``).
      unit: Singular item name (``event``).
      stream: Where to write; ``sys.stderr`` by default. ``stream.isatty()`` picks the kind.
      interval: Seconds between plain lines (not used for the bar).
      clock: Time source of the plain lines, in seconds.

    Returns:
      An object with ``update(n=1)`` and ``close()``.
    """
    if not enabled:
        return NullProgress()
    stream = stream or sys.stderr
    if _isatty(stream):
        return CountBar(total, label, unit, stream=stream)
    return CountLines(total, label, unit, stream=stream, interval=interval, clock=clock)


# ------------------------------------------------------------------------------------ summaries


def epoch_line(
    epoch: int, epochs: int, seconds: float, losses: list[float], val: dict[str, float]
) -> str:
    """The one-line summary of an epoch, without the ``[hvdtrack]`` prefix (the logger adds it).

    Args:
      epoch: The epoch's 0-based index (shown 1-based).
      epochs: Total epochs.
      seconds: Wall time of the epoch.
      losses: This epoch's training losses (their mean is shown; NaN if none).
      val: Validation metrics (``loss``, ``auc``, ``efficiency``, ``purity``), or empty.

    Returns:
      For example ``epoch 2/3 0.2s train loss 0.6280 | val loss 0.5679 auc 0.3676
      efficiency 1.0000 purity 0.9297``.
    """
    train_loss = sum(losses) / len(losses) if losses else float("nan")
    text = f"epoch {epoch + 1}/{epochs} {seconds:.1f}s train loss {train_loss:.4f}"
    if val:
        text += (
            f" | val loss {val['loss']:.4f} auc {val['auc']:.4f} efficiency {val['efficiency']:.4f}"
            f" purity {val['purity']:.4f}"
        )
    return text
