"""The one definition of the stored graph format, and its tf.train.Example encoding both ways.

A graph record is a serialized ``tf.train.Example`` whose features are the fields of ``FIELDS``
(named as the ``HitGraph`` fields) plus ``schema_version``. Arrays are stored as one
little-endian raw-bytes value each (parsing them is about 2x faster than typed float/int64
lists and encoding about 40x faster, measured on 5k-node / 40k-edge graphs); scalars are int64.

The numpy side (``graph_to_example``, ``example_to_graph``) encodes and decodes the protobuf
wire format itself, so processes that only build graphs (a parallel ``prepare``) never import
TensorFlow; the bytes are the same as ``tf.train.Example.SerializeToString(deterministic=True)``.
The TensorFlow side (``parse_example_batch``) is what tf.data pipelines map over batches of
serialized records.

Public symbols: ``SCHEMA_VERSION``, ``NODE_FEATURE_SIZE``, ``EDGE_FEATURE_SIZE``, ``FieldSpec``,
``FIELDS``, ``FIELDS_BY_NAME``, ``VERSION_KEY``, ``validate_graph``, ``graph_to_example``,
``example_to_graph``, ``parse_example_batch``,
``version_mismatch_message``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from hvdtrack.errors import DataError
from hvdtrack.graphs.construction import HitGraph

SCHEMA_VERSION = 1
NODE_FEATURE_SIZE = 3  # [r/1000, phi/pi, z/1000]
EDGE_FEATURE_SIZE = 4  # [dr, dphi, dz, deta], scaled
VERSION_KEY = "schema_version"


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One stored field.

    Attributes:
      name: the ``HitGraph`` field and the tf.train.Example feature key.
      dtype: numpy dtype name of the stored values.
      shape: dimensions; ``"N"`` (nodes) and ``"E"`` (edges) are symbols, ints are fixed
        sizes; ``()`` marks a scalar.
      description: what the field holds.
    """

    name: str
    dtype: str
    shape: tuple[Union[str, int], ...]
    description: str

    @property
    def is_array(self) -> bool:
        return len(self.shape) > 0

    @property
    def feature_size(self) -> Optional[int]:
        """The fixed last dimension of a 2-D field (3 for nodes), None for 1-D fields/scalars."""
        return self.shape[1] if len(self.shape) == 2 else None

    def shape_text(self) -> str:
        return "[" + ", ".join(str(d) for d in self.shape) + "]"


FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "nodes", "float32", ("N", NODE_FEATURE_SIZE), "node features [r/1000, phi/pi, z/1000]"
    ),
    FieldSpec("edges", "float32", ("E", EDGE_FEATURE_SIZE), "edge features [dr, dphi, dz, deta]"),
    FieldSpec("senders", "int32", ("E",), "index of each edge's inner hit, in [0, N)"),
    FieldSpec("receivers", "int32", ("E",), "index of each edge's outer hit, in [0, N)"),
    FieldSpec("labels", "float32", ("E",), "1 for a true segment, 0 otherwise"),
    FieldSpec("hit_id", "int64", ("N",), "TrackML hit_id of each node"),
    FieldSpec("event_id", "int64", (), "event number"),
    FieldSpec("section", "int64", (), "index of the event section the graph covers"),
    FieldSpec("num_true_segments", "int64", (), "true segments before the geometric cuts"),
)
FIELDS_BY_NAME: dict[str, FieldSpec] = {f.name: f for f in FIELDS}
_SIZE_SYMBOLS = {"N": "nodes", "E": "edges"}


# ------------------------------------------------------------------------------ numpy side
def validate_graph(graph: HitGraph) -> dict[str, Any]:
    """Checks a graph against the schema and returns its fields in the stored dtypes.

    Args:
      graph: a ``HitGraph``.

    Returns:
      ``{field name: value}``: little-endian numpy arrays of the schema dtype and shape for array
      fields, Python ints for scalars.

    Raises:
      DataError: naming the graph (event and section) and the field that has the wrong kind of
        dtype, the wrong shape, non-finite features, labels outside [0, 1] or senders/receivers
        outside [0, N).
    """
    where = _graph_name(graph)
    sizes: dict[str, int] = {}
    values: dict[str, Any] = {}
    for spec in FIELDS:
        if not hasattr(graph, spec.name):
            raise DataError(
                f"{where}: has no field '{spec.name}' (schema version {SCHEMA_VERSION})"
            )
        value = np.asarray(getattr(graph, spec.name))
        want = np.dtype(spec.dtype)
        if value.dtype.kind not in _compatible_kinds(want):
            raise DataError(
                f"{where}: field '{spec.name}' has dtype {value.dtype}; the schema stores {want}"
            )
        if not spec.is_array:
            if value.ndim != 0:
                raise DataError(
                    f"{where}: field '{spec.name}' must be a scalar, got shape {value.shape}"
                )
            values[spec.name] = int(value)
            continue
        if value.ndim != len(spec.shape) or any(
            isinstance(d, int) and d != n for d, n in zip(spec.shape, value.shape)
        ):
            raise DataError(
                f"{where}: field '{spec.name}' has shape {value.shape}; "
                f"the schema wants {spec.shape_text()}"
            )
        symbol = spec.shape[0]
        if symbol in sizes and sizes[symbol] != value.shape[0]:
            raise DataError(
                f"{where}: field '{spec.name}' has {value.shape[0]} rows but the graph has "
                f"{sizes[symbol]} {_SIZE_SYMBOLS[symbol]} ({symbol})"
            )
        sizes.setdefault(symbol, value.shape[0])
        stored = value.astype(want.newbyteorder("<"), copy=False)
        if want.kind != "f" and not np.array_equal(stored, value):
            raise DataError(f"{where}: field '{spec.name}' has values that do not fit in {want}")
        values[spec.name] = stored
    num_nodes = sizes.get("N", 0)
    for name in ("nodes", "edges", "labels"):
        if not np.isfinite(values[name]).all():
            raise DataError(f"{where}: field '{name}' holds NaN or infinite values")
    labels = values["labels"]
    if labels.size and (labels.min() < 0 or labels.max() > 1):
        raise DataError(f"{where}: field 'labels' has values outside [0, 1]")
    for name in ("senders", "receivers"):
        index = values[name]
        if index.size and (index.min() < 0 or index.max() >= num_nodes):
            raise DataError(
                f"{where}: field '{name}' has node indices outside [0, {num_nodes}) "
                f"(min {index.min()}, max {index.max()})"
            )
    return values


def graph_to_example(graph: HitGraph) -> bytes:
    """Serializes a graph into a ``tf.train.Example`` of the current schema.

    Args:
      graph: a ``HitGraph`` (checked with ``validate_graph``).

    Returns:
      The serialized Example; byte-identical to TensorFlow's deterministic serialization.

    Raises:
      DataError: when the graph does not fit the schema (see ``validate_graph``).
    """
    values = validate_graph(graph)
    features = {VERSION_KEY: _int64_feature(SCHEMA_VERSION)}
    for spec in FIELDS:
        value = values[spec.name]
        features[spec.name] = (
            _bytes_feature(value.tobytes()) if spec.is_array else _int64_feature(value)
        )
    return encode_features(features)


def example_to_graph(serialized: bytes, where: str = "a record") -> HitGraph:
    """Decodes a serialized Example of the current schema into a ``HitGraph``.

    Args:
      serialized: one record, as written by ``graph_to_example``.
      where: names the record in error messages, e.g. ``"record 17 of train-00003-of-00016.tfrecord"``.

    Returns:
      The graph, its arrays fresh (writable) copies in the schema dtypes.

    Raises:
      DataError: when the record has another schema version, misses a field, or its arrays do not
        have the schema shapes.
    """
    features = decode_features(serialized, where)
    version = _scalar(features, VERSION_KEY, where, missing=-1)
    if version != SCHEMA_VERSION:
        raise DataError(version_mismatch_message(where, version))
    values: dict[str, Any] = {}
    sizes: dict[str, int] = {}
    for spec in FIELDS:
        if not spec.is_array:
            values[spec.name] = _scalar(features, spec.name, where)
            continue
        raw = features.get(spec.name)
        if not isinstance(raw, bytes):
            raise DataError(f"{where}: field '{spec.name}' is missing or not raw bytes")
        dtype = np.dtype(spec.dtype).newbyteorder("<")
        width = dtype.itemsize * (spec.feature_size or 1)
        if len(raw) % width:
            raise DataError(
                f"{where}: field '{spec.name}' holds {len(raw)} bytes, not a whole number of "
                f"{spec.shape_text()} rows of {spec.dtype}"
            )
        array = np.frombuffer(raw, dtype=dtype).astype(spec.dtype)  # native order, writable copy
        if spec.feature_size:
            array = array.reshape(-1, spec.feature_size)
        symbol = spec.shape[0]
        if sizes.setdefault(symbol, array.shape[0]) != array.shape[0]:
            raise DataError(
                f"{where}: field '{spec.name}' has {array.shape[0]} rows but the record has "
                f"{sizes[symbol]} {_SIZE_SYMBOLS[symbol]}"
            )
        values[spec.name] = array
    return HitGraph(**values)


def version_mismatch_message(where: str, version: int) -> str:
    """The message for a record (or manifest) of another schema version."""
    found = "no schema version" if version < 0 else f"schema version {version}"
    return f"{where} has {found}; this hvdtrack reads version {SCHEMA_VERSION} - re-run hvdtrack prepare"


# ------------------------------------------------------------------------ TensorFlow side
def parse_example_batch(
    serialized: Any, where: Any, fields: Optional[Sequence[str]] = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parses a batch of records into concatenated fields, with one copy per field.

    Array fields of all records are joined as bytes and decoded once, which is what merging the
    records into one graph batch needs; it avoids per-record tensors and ragged batching.

    Args:
      serialized: string tensor [B], records.
      where: string tensor [B] naming each record for error messages.
      fields: names of the fields to decode (default: all of ``FIELDS``).

    Returns:
      ``(values, rows)``: ``values[name]`` is the concatenation over the batch (``nodes``
      float32 [sum N, 3], ``senders`` int32 [sum E], ...; scalars int64 [B]); ``rows`` maps
      ``"N"`` and ``"E"`` to int32 [B] nodes and edges per record (for the symbols of the
      requested fields).

    Raises:
      tf.errors.InvalidArgumentError: (when evaluated) for a record of another schema version
        or whose fields disagree in size, naming the first such record; DataError when eager.
    """
    import tensorflow as tf

    specs = _specs(fields)
    parsed = tf.io.parse_example(serialized, _tf_features(specs))
    checks = _version_checks(parsed.pop(VERSION_KEY), where)
    rows: dict[str, Any] = {}
    consistent = []
    for spec in specs:
        if not spec.is_array:
            continue
        row_bytes = np.dtype(spec.dtype).itemsize * (spec.feature_size or 1)
        length = tf.strings.length(parsed[spec.name])
        count = length // row_bytes
        consistent.append(tf.equal(length % row_bytes, 0))
        symbol = spec.shape[0]
        if symbol in rows:
            consistent.append(tf.equal(count, rows[symbol]))
        else:
            rows[symbol] = count
    if consistent:
        good = tf.reduce_all(tf.stack(consistent), axis=0)
        first = tf.argmin(tf.cast(good, tf.int32))
        message = tf.strings.join(
            [tf.gather(where, first), " has fields whose sizes disagree - re-run hvdtrack prepare"]
        )
        checks.append(tf.debugging.Assert(tf.reduce_all(good), [message], summarize=1))
    values = {}
    with tf.control_dependencies(checks):
        for spec in specs:
            value = parsed[spec.name]
            if spec.is_array:
                joined = tf.strings.reduce_join(value)
                value = tf.io.decode_raw(joined, tf.as_dtype(spec.dtype), little_endian=True)
                if spec.feature_size:
                    value = tf.reshape(value, [-1, spec.feature_size])
            values[spec.name] = tf.identity(value)
    return values, {symbol: tf.identity(count) for symbol, count in rows.items()}


def _specs(fields: Optional[Sequence[str]]) -> list[FieldSpec]:
    return [FIELDS_BY_NAME[name] for name in (fields or [f.name for f in FIELDS])]


def _tf_features(specs: Sequence[FieldSpec]) -> dict[str, Any]:
    import tensorflow as tf

    features = {VERSION_KEY: tf.io.FixedLenFeature([], tf.int64, default_value=-1)}
    for spec in specs:
        features[spec.name] = tf.io.FixedLenFeature([], tf.string if spec.is_array else tf.int64)
    return features


def _version_checks(version: Any, where: Any) -> list:
    """Checks int64 [B] versions: raises DataError when eager, else returns an Assert op."""
    import tensorflow as tf

    where = tf.convert_to_tensor(where, tf.string)
    bad = tf.not_equal(version, SCHEMA_VERSION)
    first = tf.argmax(tf.cast(bad, tf.int32))
    if tf.executing_eagerly():
        if bool(tf.reduce_any(bad)):
            found = int(version[first])
            raise DataError(version_mismatch_message(where[first].numpy().decode(), found))
        return []
    found_version = tf.gather(version, first)
    found = tf.where(
        found_version < 0,
        tf.constant("no schema version"),
        tf.strings.join(["schema version ", tf.strings.as_string(found_version)]),
    )
    message = tf.strings.join(
        [
            tf.gather(where, first),
            " has ",
            found,
            f"; this hvdtrack reads version {SCHEMA_VERSION} - re-run hvdtrack prepare",
        ]
    )
    return [tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [message], summarize=1)]


# ----------------------------------------------------------------- protobuf wire format
# tf.train.Example = {1: Features}; Features = {1: repeated MapEntry{1: key, 2: Feature}};
# Feature = {1: BytesList{1: repeated bytes} | 2: FloatList | 3: Int64List{1: packed int64}}.
def encode_features(features: Mapping[str, bytes]) -> bytes:
    """Serializes ``{key: encoded Feature}`` as a tf.train.Example (keys sorted, as TF does)."""
    entries = [
        _len_field(1, _len_field(1, key.encode()) + _len_field(2, feature))
        for key, feature in sorted(features.items())
    ]
    return _len_field(1, b"".join(entries))


def decode_features(serialized: bytes, where: str = "a record") -> dict[str, Union[bytes, list]]:
    """Parses a serialized tf.train.Example into ``{key: bytes (one-value BytesList) or list}``.

    Raises:
      DataError: naming ``where`` when the bytes are not a tf.train.Example.
    """
    try:
        view = memoryview(serialized)
        features = b"".join(bytes(v) for n, _, v in _fields(view) if n == 1)
        out: dict[str, Union[bytes, list]] = {}
        for number, _, entry in _fields(memoryview(features)):
            if number != 1:
                continue
            key, feature = b"", b""
            for n, _, v in _fields(entry):
                if n == 1:
                    key = bytes(v)
                elif n == 2:
                    feature = v
            out[key.decode()] = _decode_feature(feature)
        return out
    except (ValueError, IndexError, UnicodeDecodeError) as err:
        raise DataError(f"{where} is not a tf.train.Example ({err})") from None


def _decode_feature(feature: memoryview) -> Union[bytes, list]:
    for kind, _, payload in _fields(feature):
        if kind == 1:  # BytesList
            values = [bytes(v) for n, _, v in _fields(payload) if n == 1]
            return values[0] if len(values) == 1 else values
        if kind == 2:  # FloatList, packed or not
            floats: list[float] = []
            for n, wire, v in _fields(payload):
                if n == 1:
                    floats.extend(np.frombuffer(bytes(v), "<f4").tolist() if wire == 2 else [v])
            return floats
        if kind == 3:  # Int64List, packed or not
            ints: list[int] = []
            for n, wire, v in _fields(payload):
                if n == 1:
                    ints.extend(_unpack_varints(v) if wire == 2 else [_signed(v)])
            return ints
    return []


def _fields(view: memoryview):
    """Yields (field number, wire type, value) over a message: value is an int or a memoryview."""
    pos, end = 0, len(view)
    while pos < end:
        tag, pos = _read_varint(view, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(view, pos)
        elif wire == 2:
            size, pos = _read_varint(view, pos)
            if pos + size > end:
                raise ValueError("length runs past the end of the message")
            value, pos = view[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = np.frombuffer(bytes(view[pos : pos + 4]), "<f4")[0].item(), pos + 4
        elif wire == 1:
            value, pos = int.from_bytes(view[pos : pos + 8], "little"), pos + 8
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _unpack_varints(view: memoryview) -> list[int]:
    values, pos = [], 0
    while pos < len(view):
        value, pos = _read_varint(view, pos)
        values.append(_signed(value))
    return values


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 -> two's complement, as protobuf does
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _bytes_feature(value: bytes) -> bytes:
    return _len_field(1, _len_field(1, value))


def _int64_feature(value: int) -> bytes:
    return _len_field(3, _len_field(1, _varint(value)))


# ---------------------------------------------------------------------------- internals
def _compatible_kinds(dtype: np.dtype) -> str:
    # Floats may come as any float (or bool for labels); integers as signed or unsigned ints.
    return "fb" if dtype.kind == "f" else "iu"


def _scalar(
    features: Mapping[str, Any], key: str, where: str, missing: Optional[int] = None
) -> int:
    value = features.get(key)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], int):
        return value[0]
    if value is None and missing is not None:
        return missing
    raise DataError(f"{where}: field '{key}' is missing or not one int64")


def _graph_name(graph: Any) -> str:
    event = getattr(graph, "event_id", "?")
    section = getattr(graph, "section", "?")
    return f"graph of event {event} section {section}"
