"""The graph format: encoding both ways, TensorFlow compatibility, validation and versions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from hvdtrack.errors import DataError
from hvdtrack.graphs.construction import HitGraph
from hvdtrack.records import schema
from hvdtrack.records.schema import example_to_graph, graph_to_example, parse_example_batch


def tiny_graph() -> HitGraph:
    return HitGraph(
        nodes=np.array([[0.032, 0.1, -0.2], [0.072, 0.11, -0.3], [0.116, 0.12, -0.4]], np.float32),
        edges=np.array([[0.04, 0.01, -0.1, 0.02], [0.044, 0.01, -0.1, 0.03]], np.float32),
        senders=np.array([0, 1], np.int32),
        receivers=np.array([1, 2], np.int32),
        labels=np.array([1.0, 0.0], np.float32),
        hit_id=np.array([7, 8, 9], np.int64),
        event_id=1000,
        section=3,
        num_true_segments=2,
    )


def hand_made_record(version: int, graph: HitGraph) -> bytes:
    """A record written with TensorFlow's own protobuf classes, with any schema version."""

    def raw(array):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[array.tobytes()]))

    def int64(value):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    feature = {"schema_version": int64(version)}
    for field in schema.FIELDS:
        value = getattr(graph, field.name)
        feature[field.name] = raw(np.asarray(value)) if field.is_array else int64(value)
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString(deterministic=True)


def test_round_trip_keeps_every_field(make_graph, graphs_equal):
    graph = make_graph(np.random.default_rng(1), num_nodes=50, num_edges=120)
    graphs_equal(example_to_graph(graph_to_example(graph)), graph)


def test_empty_graph_round_trips(make_graph, graphs_equal):
    graph = make_graph(np.random.default_rng(1), num_nodes=0, num_edges=0)
    graphs_equal(example_to_graph(graph_to_example(graph)), graph)


def test_bytes_equal_tensorflow_serialization():
    graph = tiny_graph()
    ours = graph_to_example(graph)
    assert ours == hand_made_record(schema.SCHEMA_VERSION, graph)
    parsed = tf.train.Example.FromString(ours).features.feature
    assert parsed["event_id"].int64_list.value == [1000]
    assert parsed["nodes"].bytes_list.value == [graph.nodes.tobytes()]


def test_negative_scalars_round_trip(graphs_equal):
    graph = dataclasses.replace(tiny_graph(), event_id=-5, section=0)
    encoded = graph_to_example(graph)
    assert tf.train.Example.FromString(encoded).features.feature["event_id"].int64_list.value == [
        -5
    ]
    graphs_equal(example_to_graph(encoded), graph)


def test_parse_example_batch_of_one_record_matches_the_graph():
    graph = tiny_graph()
    parsed, rows = parse_example_batch(tf.constant([graph_to_example(graph)]), tf.constant(["a"]))
    assert rows["N"].numpy().tolist() == [3] and rows["E"].numpy().tolist() == [2]
    for field in schema.FIELDS:
        value = parsed[field.name].numpy()
        expected = np.asarray(getattr(graph, field.name))
        np.testing.assert_array_equal(value, expected if field.is_array else expected[None])
    assert parsed["nodes"].dtype == tf.float32 and parsed["senders"].dtype == tf.int32
    assert parsed["hit_id"].dtype == tf.int64 and parsed["edges"].shape == (2, 4)


def test_parse_example_batch_in_a_dataset_has_static_feature_sizes():
    dataset = (
        tf.data.Dataset.from_tensors(graph_to_example(tiny_graph()))
        .batch(1)
        .map(lambda records: parse_example_batch(records, tf.constant(["a"]))[0])
    )
    assert dataset.element_spec["nodes"].shape.as_list() == [None, 3]
    assert dataset.element_spec["edges"].shape.as_list() == [None, 4]
    assert dataset.element_spec["labels"].shape.as_list() == [None]


def test_parse_example_batch_concatenates_records(make_graph):
    rng = np.random.default_rng(5)
    graphs = [make_graph(rng, 4, 6), make_graph(rng, 0, 0), make_graph(rng, 3, 2)]
    records = tf.constant([graph_to_example(g) for g in graphs])
    values, rows = schema.parse_example_batch(records, tf.constant(["a", "b", "c"]))
    assert rows["N"].numpy().tolist() == [4, 0, 3] and rows["E"].numpy().tolist() == [6, 0, 2]
    for field in schema.FIELDS:
        parts = [np.asarray(getattr(g, field.name)) for g in graphs]
        expected = np.concatenate(parts) if field.is_array else np.stack(parts)
        np.testing.assert_array_equal(values[field.name].numpy(), expected, err_msg=field.name)


def test_parse_example_batch_refuses_records_whose_sizes_disagree():
    broken = dataclasses.replace(tiny_graph(), labels=np.zeros(3, np.float32))  # 2 edges
    records = [graph_to_example(tiny_graph()), hand_made_record(1, broken)]
    parse = tf.function(
        lambda r: schema.parse_example_batch(r, tf.constant(["record 0 of a", "record 1 of a"]))
    )
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match="record 1 of a has fields whose sizes disagree - re-run hvdtrack prepare",
    ):
        parse(tf.constant(records))


def test_record_of_another_version_is_refused_by_numpy_side():
    record = hand_made_record(2, tiny_graph())
    with pytest.raises(
        DataError,
        match=r"^record 17 of train-00003-of-00016\.tfrecord has schema version 2; this hvdtrack "
        r"reads version 1 - re-run hvdtrack prepare$",
    ):
        example_to_graph(record, "record 17 of train-00003-of-00016.tfrecord")


def test_record_without_version_is_refused():
    example = tf.train.Example.FromString(hand_made_record(1, tiny_graph()))
    del example.features.feature["schema_version"]
    with pytest.raises(DataError, match="a record has no schema version; this hvdtrack reads"):
        example_to_graph(example.SerializeToString())


def test_record_of_another_version_is_refused_by_tensorflow_side():
    record = hand_made_record(2, tiny_graph())
    with pytest.raises(
        DataError, match="record 4 of x.tfrecord has schema version 2; this hvdtrack"
    ):
        parse_example_batch(tf.constant([record]), tf.constant(["record 4 of x.tfrecord"]))
    dataset = (
        tf.data.Dataset.from_tensors(record)
        .batch(1)
        .map(lambda r: parse_example_batch(r, tf.constant(["record 0 of y"])))
    )
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match="record 0 of y has schema version 2; this hvdtrack reads version 1 - re-run",
    ):
        next(iter(dataset))


def test_bytes_that_are_not_an_example_are_refused():
    with pytest.raises(DataError, match="record 3 of z is not a tf.train.Example"):
        example_to_graph(b"\x0a\xff\xff\x01junk", "record 3 of z")


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"edges": np.zeros((2, 3), np.float32)},
            r"field 'edges' has shape \(2, 3\); the schema wants \[E, 4\]",
        ),
        (
            {"labels": np.zeros(3, np.float32)},
            "field 'labels' has 3 rows but the graph has 2 edges",
        ),
        (
            {"hit_id": np.zeros(3, np.float32)},
            "field 'hit_id' has dtype float32; the schema stores int64",
        ),
        (
            {"receivers": np.array([1, 3], np.int32)},
            r"field 'receivers' has node indices outside \[0, 3\)",
        ),
        (
            {"nodes": np.full((3, 3), np.nan, np.float32)},
            "field 'nodes' holds NaN or infinite values",
        ),
        (
            {"labels": np.array([2.0, 0.0], np.float32)},
            r"field 'labels' has values outside \[0, 1\]",
        ),
        ({"senders": np.array([0, 2**40])}, "field 'senders' has values that do not fit in int32"),
    ],
)
def test_invalid_graph_is_refused_naming_field(change, message):
    graph = dataclasses.replace(tiny_graph(), **change)
    with pytest.raises(DataError, match=f"^graph of event 1000 section 3: {message}"):
        graph_to_example(graph)


def test_compatible_dtypes_are_cast_to_the_schema():
    graph = dataclasses.replace(
        tiny_graph(), nodes=tiny_graph().nodes.astype(np.float64), senders=np.array([0, 1])
    )
    decoded = example_to_graph(graph_to_example(graph))
    assert decoded.nodes.dtype == np.float32 and decoded.senders.dtype == np.int32
    np.testing.assert_array_equal(decoded.nodes, tiny_graph().nodes)


def test_schema_table_matches_the_hitgraph_fields():
    assert [f.name for f in schema.FIELDS] == [f.name for f in dataclasses.fields(HitGraph)]
    assert schema.FIELDS_BY_NAME["nodes"].shape == ("N", schema.NODE_FEATURE_SIZE)
    assert schema.FIELDS_BY_NAME["edges"].shape == ("E", schema.EDGE_FEATURE_SIZE)
