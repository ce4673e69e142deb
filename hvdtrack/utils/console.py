"""Console output that stays readable in SLURM/horovodrun logs: rank-aware logging and progress."""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any, Callable, TextIO

from tqdm import tqdm

LOGGER_NAME = "hvdtrack"
DEFAULT_INTERVAL_S = 30.0
# Python loggers of libraries whose warnings every rank repeats (tf.function retracing,
# deprecations, tf.data notices); on non-chief ranks only their errors are kept.
LIBRARY_LOGGERS = ("tensorflow", "absl")
# Plain progress lines, formatted like tqdm's ``bar_format`` (``eta`` as ``format_eta`` gives it).
_EPOCH_LINE = "{desc} step {n}/{total} {postfix} eta {eta}"
_COUNT_LINE = "{desc} {n}/{total} {unit}s {rate:,.1f} {unit}s/s eta {eta}"

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


class NullProgress:
    """The reporter of non-chief ranks (or with progress disabled): does nothing."""

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Ignores its arguments."""

    def close(self) -> None:
        """Does nothing."""


class LineProgress:
    """Plain progress lines for logs: one per ``interval`` seconds, never a carriage return.

    Mimics the part of ``tqdm`` that ``progress`` and ``counter`` use (``n``, ``update``,
    ``set_postfix_str``, ``close``). Not ``tqdm`` itself: its status printer starts every refresh
    with ``\\r`` whatever the file (non-terminals included), its monitor thread and ``close()``
    print on their own schedule, and its rate is a moving average that would keep counting the
    first training step (tf.function tracing). No line is written before ``interval`` seconds or
    for the last unit (short runs print nothing: a summary line follows anyway).
    """

    def __init__(
        self,
        fmt: str,
        total: int,
        initial: int = 0,
        *,
        warmup: bool = False,
        stream: TextIO | None = None,
        interval: float = DEFAULT_INTERVAL_S,
        clock: Clock = time.monotonic,
        **fields: Any,
    ):
        """Starts timing; ``fmt`` is a ``str.format`` template of ``n``, ``total``, ``rate``
        (units/s), ``eta``, ``postfix`` and ``fields``. With ``warmup``, the rate is measured from
        the first ``update`` on (once there is a later one), which leaves out tf.function tracing.
        """
        self.fmt, self.total, self.n, self.fields = fmt, total, initial, fields
        self.postfix = ""
        self.stream = stream or sys.stderr
        self.interval, self.clock = interval, clock
        self.start = (clock(), initial)
        self.last_line = self.start[0]
        self.base: tuple[float, int] | None = None if warmup else self.start

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """Sets the ``postfix`` of the next line (``refresh`` is ignored, as in ``tqdm``'s API)."""
        self.postfix = s

    def update(self, n: int = 1) -> None:
        """Counts ``n`` more units; writes a line if one is due."""
        self.n += n
        now = self.clock()
        if self.base is None:
            self.base = (now, self.n)
        if self.n >= self.total or now - self.last_line < self.interval:
            return
        self.last_line = now
        since, base = self.base if self.n > self.base[1] else self.start
        rate = (self.n - base) / (now - since) if self.n > base and now > since else math.nan
        eta = format_eta((self.total - self.n) / rate if rate > 0 else math.nan)
        line = self.fmt.format(
            n=self.n, total=self.total, rate=rate, eta=eta, postfix=self.postfix, **self.fields
        )
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Nothing to undo: every line is already complete."""


class EpochProgress:
    """One epoch's steps with loss and edges/s, shown by ``bar`` (``tqdm`` or ``LineProgress``)."""

    def __init__(self, bar: tqdm | LineProgress):
        self.bar = bar

    def update(self, step: int, loss: float, edges_per_s: float) -> None:
        """Records that step ``step`` (0-based) finished, with its loss and edges/s."""
        self.bar.set_postfix_str(f"loss {loss:.4f} edges/s {edges_per_s:,.0f}", refresh=False)
        self.bar.update(step + 1 - self.bar.n)

    def close(self) -> None:
        """Ends the bar (a terminal bar is removed: the epoch summary line replaces it)."""
        self.bar.close()


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
) -> NullProgress | EpochProgress:
    """The progress reporter of one epoch: a bar on a terminal, plain lines otherwise.

    A plain line looks like
    ``[hvdtrack] epoch 3/24 step 12/20 loss 0.1234 edges/s 15,321 eta 0:00:07``; its ETA uses
    the rate since the first update (which excludes the first step and its tf.function tracing)
    once there is a later one.

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
    desc = f"epoch {epoch + 1}/{epochs}" if epochs else f"epoch {epoch + 1}"
    if _isatty(stream):
        bar = tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit="step",
            file=stream,
            dynamic_ncols=True,
            leave=False,  # the epoch summary line takes its place
            mininterval=1.0,
        )
        return EpochProgress(bar)
    line = LineProgress(
        _EPOCH_LINE,
        total,
        initial,
        warmup=True,
        stream=stream,
        interval=interval,
        clock=clock,
        desc=f"[hvdtrack] {desc}",
    )
    return EpochProgress(line)


def counter(
    enabled: bool,
    total: int,
    label: str,
    unit: str,
    *,
    stream: TextIO | None = None,
    interval: float = DEFAULT_INTERVAL_S,
    clock: Clock = time.monotonic,
) -> NullProgress | tqdm | LineProgress:
    """A counter of work items: a bar on a terminal, plain lines otherwise, nothing if disabled.

    A plain line looks like ``[prepare] 40/600 events 7.4 events/s eta 0:01:16`` (the rate is
    measured from the start).

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
        return tqdm(total=total, desc=label, unit=unit, file=stream, dynamic_ncols=True)
    return LineProgress(
        _COUNT_LINE,
        total,
        stream=stream,
        interval=interval,
        clock=clock,
        desc=f"[{label}]",
        unit=unit,
    )


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
