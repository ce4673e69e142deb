"""The one line a MultiWorker rank prints when a peer failed: it names the peer, not itself."""

import json

import pytest
import tensorflow as tf

from hvdtrack.config import load_config
from hvdtrack.train.__main__ import _peer_failure

# As tf.distribute words it on worker 0 when worker 1 was killed: its own task comes first.
GONE = (
    "Collective ops is aborted by: failed to connect to all addresses\n"
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1:\n"
    "... from /job:worker/replica:0/task:0 to /job:worker/replica:0/task:1"
)
GONE_OWN_FIRST = (
    "Collective ops is aborted by: Socket closed\n"
    "The error could be from a previous operation on /job:worker/replica:0/task:0; "
    "peer /job:worker/replica:0/task:1"
)
SILENT = (
    "Collective ops is aborted by: /job:worker/replica:0/task:0 reports: "
    "/job:worker/replica:0/task:1 heartbeat timeout"
)


def message(text, monkeypatch, index):
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": index}}
        ),
    )
    config = load_config("configs/tiny.yaml", ["distributed.deadline_s=30"])
    err = _peer_failure(tf.errors.UnavailableError(None, None, text), config)
    return str(err)


@pytest.mark.parametrize("text", [GONE, GONE_OWN_FIRST])
def test_a_gone_peer_is_named_not_the_worker_itself(text, monkeypatch):
    said = message(text, monkeypatch, index=0)
    assert "rank 0: worker 1 is gone (its connection closed: killed or crashed)" in said, said


def test_a_silent_peer_is_the_one_the_heartbeat_timeout_names(monkeypatch):
    said = message(SILENT, monkeypatch, index=0)
    assert "worker 1 sent no heartbeat for distributed.deadline_s (30.0 s)" in said, said


def test_other_errors_are_not_peer_failures():
    config = load_config("configs/tiny.yaml", [])
    assert _peer_failure(ValueError("task:1 Socket closed"), config) is None
    assert _peer_failure(tf.errors.InvalidArgumentError(None, None, "bad shape"), config) is None
