"""The reader refuses a record whose edges name hits outside it, naming record and edge."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.inputs.reader import checked_endpoints
from hvdtrack.records import schema
from hvdtrack.records.schema import graph_to_example
from tests.records.test_schema import hand_made_record, tiny_graph


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("receivers", 3, "record 2 of a: edge 1 has receiver 3, outside its 3 hits"),
        ("senders", -1, "record 2 of a: edge 1 has sender -1, outside its 3 hits"),
    ],
)
def test_the_reader_refuses_an_endpoint_outside_its_record(make_graph, field, value, message):
    # Record 0 has 4 hits and uses hit 3; record 1 is empty. Checked against another record's
    # hit count, or the batch's 7, receiver 3 of record 2 (3 hits) would pass.
    four = dataclasses.replace(
        tiny_graph(),
        nodes=np.concatenate([tiny_graph().nodes, tiny_graph().nodes[:1]]),
        hit_id=np.array([7, 8, 9, 10], np.int64),
        senders=np.array([0, 2], np.int32),
        receivers=np.array([1, 3], np.int32),
    )
    empty = make_graph(np.random.default_rng(0), 0, 0)
    ends = getattr(tiny_graph(), field).copy()
    ends[1] = value
    broken = dataclasses.replace(tiny_graph(), **{field: ends})
    where = tf.constant([f"record {i} of a" for i in range(3)])
    parse = tf.function(lambda r, w: checked_endpoints(*schema.parse_example_batch(r, w), w))
    good = [graph_to_example(g) for g in (four, empty)]
    values = parse(tf.constant(good), where[:2])
    assert values["receivers"].numpy().tolist() == [1, 3]
    with pytest.raises(tf.errors.InvalidArgumentError, match=message + " - re-run hvdtrack"):
        parse(tf.constant([*good, hand_made_record(1, broken)]), where)
