"""Heartbeats between ranks (``hvdtrack.distributed.watchdog``) over real sockets in one process: a
peer that goes silent or drops its connection is named; one that says goodbye is not."""

import socket
import time

import pytest

from hvdtrack.distributed.watchdog import Watchdog

DEADLINE = 1.0
# A deadline no test reaches: what is named under it came from a closed connection, not silence.
NEVER = 600.0
# How long a test waits for a failure to be reported: a bound against a watchdog that never
# reports, generous for a loaded machine (a report comes within DEADLINE + 0.1 s here).
REPORT_WITHIN = 60.0


class Failures:
    def __init__(self):
        self.messages = []

    def __call__(self, message):
        self.messages.append(message)

    def wait(self, timeout=REPORT_WITHIN):
        end = time.monotonic() + timeout
        while not self.messages and time.monotonic() < end:
            time.sleep(0.05)
        return self.messages


@pytest.fixture
def make_chief():
    """``make_chief(deadline) -> (watchdog, failures, announced)`` of rank 0 of 2."""
    dogs = []

    def make(deadline=DEADLINE):
        failures, announced = Failures(), []
        dogs.append(Watchdog(0, 2, deadline, lambda v: announced.append(v) or v, failures))
        return dogs[-1], failures, announced[0]

    yield make
    for dog in dogs:
        dog.stop()


def raw_rank(announced, rank=1, token=None):
    addresses, port, real_token = announced
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"hello %s %d\n" % ((token or real_token).encode(), rank))
    return sock


def test_a_rank_that_stops_answering_is_named_after_the_deadline(make_chief):
    dog, failures, announced = make_chief()
    started = time.monotonic()  # before the chief can have heard the rank
    sock = raw_rank(announced)  # says hello, then nothing: a stopped process
    messages = failures.wait()
    assert messages and "rank 1 has not answered" in messages[0], messages
    # Silence is counted from the last byte heard, which came after ``started``: never sooner.
    assert time.monotonic() - started >= DEADLINE
    assert "distributed.deadline_s: 1 s" in messages[0]
    sock.close()


def test_a_rank_whose_connection_closes_without_goodbye_is_named_at_once(make_chief):
    dog, failures, announced = make_chief(NEVER)
    sock = raw_rank(announced)
    time.sleep(0.2)
    sock.close()  # killed: the kernel closes its sockets
    messages = failures.wait()
    assert messages and "rank 1 ended without finishing" in messages[0], messages


def test_ranks_that_beat_and_say_goodbye_end_nothing(make_chief):
    dog, failures, announced = make_chief()
    rank1_failures = Failures()
    rank1 = Watchdog(1, 2, DEADLINE, lambda value: announced, rank1_failures)
    # Heartbeats (every DEADLINE / 10) keep both sides content past the deadline: a false
    # failure needs a thread unscheduled for 10 beats.
    time.sleep(3 * DEADLINE)
    rank1.stop()
    time.sleep(2 * DEADLINE)
    dog.stop()
    assert failures.messages == [] and rank1_failures.messages == []


def test_heartbeats_keep_their_interval_both_ways(make_chief):
    # Each end beats once per interval (DEADLINE / 10): 2 s give at most ~20 beats each way,
    # however fast or slow the machine. Beats sent in answer to beats would be thousands.
    dog, failures, announced = make_chief()
    rank1 = Watchdog(1, 2, DEADLINE, lambda value: announced, Failures())
    started = time.monotonic()
    time.sleep(2.0)
    (to_chief,) = [p.beats for p in dog._peers.values()]
    (to_rank1,) = [p.beats for p in rank1._peers.values()]
    bound = (time.monotonic() - started) / rank1.interval + 3
    rank1.stop()
    assert 1 <= to_rank1 <= bound and 1 <= to_chief <= bound, (to_rank1, to_chief, bound)


def test_a_rank_notices_the_chief_is_gone(make_chief):
    dog, failures, announced = make_chief(NEVER)
    rank1_failures = Failures()
    rank1 = Watchdog(1, 2, NEVER, lambda value: announced, rank1_failures)
    time.sleep(0.3)
    dog._stop.set()  # the chief's thread ends without a goodbye: its sockets then close
    dog._thread.join()
    for peer in list(dog._peers.values()):
        peer.sock.close()
    messages = rank1_failures.wait()
    assert messages and messages[0].startswith("rank 1: rank 0 ended without finishing"), messages
    rank1.stop()


def test_a_stranger_on_the_port_is_not_a_rank(make_chief):
    dog, failures, announced = make_chief()
    sock = raw_rank(announced, token="0" * 16)
    messages = failures.wait()  # the deadline passes with no rank 1
    assert messages and "rank 1 never connected" in messages[0], messages
    sock.close()
