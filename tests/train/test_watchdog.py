"""Heartbeats between ranks (``hvdtrack.distributed.watchdog``) over real sockets in one process: a
peer that goes silent or drops its connection is named; one that says goodbye is not."""

import socket
import time

import pytest

from hvdtrack.distributed.watchdog import Watchdog

DEADLINE = 1.0


class Failures:
    def __init__(self):
        self.messages = []

    def __call__(self, message):
        self.messages.append(message)

    def wait(self, timeout=10 * DEADLINE):
        end = time.monotonic() + timeout
        while not self.messages and time.monotonic() < end:
            time.sleep(0.05)
        return self.messages


@pytest.fixture
def chief():
    failures, announced = Failures(), []
    dog = Watchdog(0, 2, DEADLINE, lambda value: announced.append(value) or value, failures)
    yield dog, failures, announced[0]
    dog.stop()


def raw_rank(announced, rank=1, token=None):
    addresses, port, real_token = announced
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"hello %s %d\n" % ((token or real_token).encode(), rank))
    return sock


def test_a_rank_that_stops_answering_is_named_after_the_deadline(chief):
    dog, failures, announced = chief
    sock = raw_rank(announced)  # says hello, then nothing: a stopped process
    started = time.monotonic()
    messages = failures.wait()
    assert messages and "rank 1 has not answered" in messages[0], messages
    assert DEADLINE <= time.monotonic() - started < 5 * DEADLINE
    assert "distributed.deadline_s: 1 s" in messages[0]
    sock.close()


def test_a_rank_whose_connection_closes_without_goodbye_is_named_at_once(chief):
    dog, failures, announced = chief
    sock = raw_rank(announced)
    time.sleep(0.2)
    sock.close()  # killed: the kernel closes its sockets
    started = time.monotonic()
    messages = failures.wait()
    assert messages and "rank 1 ended without finishing" in messages[0], messages
    assert time.monotonic() - started < DEADLINE


def test_ranks_that_beat_and_say_goodbye_end_nothing(chief):
    dog, failures, announced = chief
    rank1_failures = Failures()
    rank1 = Watchdog(1, 2, DEADLINE, lambda value: announced, rank1_failures)
    time.sleep(3 * DEADLINE)  # heartbeats keep both sides content past the deadline
    rank1.stop()
    time.sleep(2 * DEADLINE)
    dog.stop()
    assert failures.messages == [] and rank1_failures.messages == []


def test_a_rank_notices_the_chief_is_gone(chief):
    dog, failures, announced = chief
    rank1_failures = Failures()
    rank1 = Watchdog(1, 2, DEADLINE, lambda value: announced, rank1_failures)
    time.sleep(0.3)
    dog._stop.set()  # the chief's thread ends without a goodbye: its sockets then close
    dog._thread.join()
    for peer in list(dog._peers.values()):
        peer.sock.close()
    messages = rank1_failures.wait()
    assert messages and messages[0].startswith("rank 1: rank 0 ended without finishing"), messages
    rank1.stop()


def test_a_stranger_on_the_port_is_not_a_rank(chief):
    dog, failures, announced = chief
    sock = raw_rank(announced, token="0" * 16)
    time.sleep(3 * DEADLINE)
    assert failures.messages and "rank 1 never connected" in failures.messages[0]
    sock.close()
