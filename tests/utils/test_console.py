"""Console output for HPC logs: rank-aware log lines, and progress without carriage returns."""

import io
import logging

import pytest
from tqdm import tqdm

from hvdtrack.utils import console


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_loggers():
    names = ("hvdtrack", *console.LIBRARY_LOGGERS)
    saved = {
        n: (
            logging.getLogger(n).level,
            list(logging.getLogger(n).handlers),
            logging.getLogger(n).propagate,
        )
        for n in names
    }
    yield
    for name, (level, handlers, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate


# ------------------------------------------------------------------------------------- logging


def test_chief_logs_info_plainly_and_names_warnings():
    out = io.StringIO()
    log = console.setup_logging(0, True, stream=out)
    assert log is logging.getLogger("hvdtrack")
    log.debug("hidden")
    log.info("epoch 1/2 done")
    log.warning("disk %s%% full", 93)
    assert out.getvalue() == "[hvdtrack] epoch 1/2 done\n[hvdtrack] WARNING: disk 93% full\n"


def test_other_ranks_log_only_warnings_with_their_rank():
    out = io.StringIO()
    log = console.setup_logging(3, False, stream=out)
    log.info("epoch 1/2 done")
    log.warning("slow input")
    log.error("two\nlines")
    assert out.getvalue() == (
        "[hvdtrack rank 3] WARNING: slow input\n"
        "[hvdtrack rank 3] ERROR: two\n"
        "[hvdtrack rank 3] lines\n"
    )


def test_other_ranks_quiet_the_tensorflow_logger_the_chief_does_not():
    logging.getLogger("tensorflow").setLevel(logging.NOTSET)
    console.setup_logging(0, True, stream=io.StringIO())
    assert logging.getLogger("tensorflow").level == logging.NOTSET
    console.setup_logging(1, False, stream=io.StringIO())
    assert logging.getLogger("tensorflow").level == logging.ERROR
    assert logging.getLogger("absl").level == logging.ERROR


def test_setup_twice_keeps_one_handler_and_the_latest_settings():
    first, second = io.StringIO(), io.StringIO()
    console.setup_logging(0, True, stream=first)
    log = console.setup_logging(2, False, stream=second)
    assert len(log.handlers) == 1 and not log.propagate
    log.warning("once")
    assert first.getvalue() == ""
    assert second.getvalue() == "[hvdtrack rank 2] WARNING: once\n"


def test_default_stream_is_stderr(capsys):
    console.setup_logging(0, True).info("to stderr")
    captured = capsys.readouterr()
    assert captured.err == "[hvdtrack] to stderr\n" and captured.out == ""


# ------------------------------------------------------------------------------------ progress


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0:00:00"),
        (7.4, "0:00:07"),
        (59.6, "0:01:00"),
        (3725, "1:02:05"),
        (93600, "26:00:00"),
        (float("nan"), "?"),
        (float("inf"), "?"),
        (-1, "?"),
    ],
)
def test_format_eta(seconds, text):
    assert console.format_eta(seconds) == text


def test_plain_lines_once_per_interval_without_carriage_returns():
    out, clock = io.StringIO(), FakeClock()
    bar = console.progress(True, 20, 0, 2, 24, stream=out, interval=30, clock=clock)
    assert isinstance(bar, console.EpochProgress) and isinstance(bar.bar, console.LineProgress)
    # Step 0 takes 20 s (tracing), then 5 s per step.
    for step, seconds in enumerate([20] + [5] * 19):
        clock.now += seconds
        bar.update(step, 0.5 - step / 100, 15321.4)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    assert text.splitlines() == [
        # 30 s after the start (20 + 2 * 5); 17 steps left at 5 s/step (the first step's 20 s
        # do not count).
        "[hvdtrack] epoch 3/24 step 3/20 loss 0.4800 edges/s 15,321 eta 0:01:25",
        "[hvdtrack] epoch 3/24 step 9/20 loss 0.4200 edges/s 15,321 eta 0:00:55",
        "[hvdtrack] epoch 3/24 step 15/20 loss 0.3600 edges/s 15,321 eta 0:00:25",
    ]


def test_no_line_for_the_last_step():
    out, clock = io.StringIO(), FakeClock()
    bar = console.progress(True, 3, 0, 0, 1, stream=out, interval=5, clock=clock)
    for step in range(3):
        clock.now += 5
        bar.update(step, 0.5, 10.0)
    # Due at every step, but the epoch summary follows the last one.
    assert [line.split(" loss")[0] for line in out.getvalue().splitlines()] == [
        "[hvdtrack] epoch 1/1 step 1/3",
        "[hvdtrack] epoch 1/1 step 2/3",
    ]


def test_first_line_estimates_from_the_start_when_the_first_step_is_due():
    out, clock = io.StringIO(), FakeClock()
    bar = console.progress(True, 10, 0, 0, stream=out, interval=30, clock=clock)
    clock.now += 40
    bar.update(0, 1.0, 1000)
    assert out.getvalue() == "[hvdtrack] epoch 1 step 1/10 loss 1.0000 edges/s 1,000 eta 0:06:00\n"


def test_a_resumed_epoch_counts_from_its_initial_step():
    out, clock = io.StringIO(), FakeClock()
    bar = console.progress(True, 100, 40, 0, 1, stream=out, interval=10, clock=clock)
    for step in range(40, 44):
        clock.now += 4
        bar.update(step, 0.25, 2e6)
    assert out.getvalue() == (
        "[hvdtrack] epoch 1/1 step 43/100 loss 0.2500 edges/s 2,000,000 eta 0:03:48\n"
    )


def test_terminal_gets_a_tqdm_bar():
    out = Terminal()
    bar = console.progress(True, 4, 0, 0, 2, stream=out, clock=FakeClock())
    assert isinstance(bar, console.EpochProgress) and isinstance(bar.bar, tqdm)
    for step in range(4):
        bar.update(step, 0.5, 100.0)
    assert bar.bar.n == 4
    bar.close()
    assert "\r" in out.getvalue() and "epoch 1/2" in out.getvalue()


def test_disabled_or_other_ranks_print_nothing(capsys):
    out = io.StringIO()
    for stream in (out, Terminal()):
        bar = console.progress(False, 4, 0, 0, stream=stream, interval=0)
        assert isinstance(bar, console.NullProgress)
        bar.update(0, 0.5, 1.0)
        bar.close()
        assert stream.getvalue() == ""
    assert capsys.readouterr() == ("", "")


def test_counter_plain_lines_and_terminal_bar():
    out, clock = io.StringIO(), FakeClock()
    count = console.counter(True, 6, "prepare", "event", stream=out, interval=20, clock=clock)
    for _ in range(6):
        clock.now += 12
        count.update()
    count.close()
    assert out.getvalue() == (
        "[prepare] 2/6 events 0.1 events/s eta 0:00:48\n"
        "[prepare] 4/6 events 0.1 events/s eta 0:00:24\n"
    )
    tty = Terminal()
    count = console.counter(True, 6, "prepare", "event", stream=tty)
    count.update(6)
    count.close()
    assert "\r" in tty.getvalue() and "6/6" in tty.getvalue()
    assert isinstance(console.counter(False, 6, "prepare", "event"), console.NullProgress)


def test_prepare_progress_has_no_carriage_returns_in_logs(capsys):
    # The default stream is sys.stderr, captured here as a file that is not a terminal.
    clock = FakeClock()
    count = console.counter(True, 3, "prepare", "event", interval=1, clock=clock)
    assert isinstance(count, console.LineProgress)
    for _ in range(3):
        clock.now += 2
        count.update(1)
    count.close()
    err = capsys.readouterr().err
    assert err == (
        "[prepare] 1/3 events 0.5 events/s eta 0:00:04\n"
        "[prepare] 2/3 events 0.5 events/s eta 0:00:02\n"
    )
    assert "\r" not in err


# ----------------------------------------------------------------------------------- summaries


def test_epoch_line():
    val = {"loss": 0.56789, "auc": 0.9, "efficiency": 0.95, "purity": 0.5}
    assert console.epoch_line(1, 3, 0.24, [0.5, 0.7], val) == (
        "epoch 2/3 0.2s train loss 0.6000 | val loss 0.5679 auc 0.9000 efficiency 0.9500"
        " purity 0.5000"
    )
    assert console.epoch_line(0, 3, 1.0, [], {}) == "epoch 1/3 1.0s train loss nan"
