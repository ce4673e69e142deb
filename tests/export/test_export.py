"""``hvdtrack export``: a SavedModel that plain TensorFlow loads (no hvdtrack, no custom op)
and that gives the run's edge scores; converted to ONNX, onnxruntime gives the same scores."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from hvdtrack.entry import run
from hvdtrack.export.__main__ import main

INPUTS = ("nodes", "edges", "senders", "receivers")
# Only TensorFlow and numpy: loads the SavedModel, scores the graph, says what it imported.
PLAIN = """
import json, sys
import numpy as np
import tensorflow as tf
graph = np.load(sys.argv[2])
loaded = tf.saved_model.load(sys.argv[1])
serve = loaded.signatures["serving_default"]
scores = serve(**{k: tf.constant(graph[k]) for k in graph.files})["scores"].numpy()
np.save(sys.argv[3], scores)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "hvdtrack")))
"""


def test_the_export_scores_like_the_run_in_plain_tensorflow_and_onnx(tiny_run, tmp_path):
    import tensorflow as tf

    from hvdtrack.evaluate.inference import load_classifier, score_graphs
    from hvdtrack.export.savedmodel import EXPORT_INFO
    from hvdtrack.records.manifest import open_dataset
    from hvdtrack.records.shards import read_split_graphs

    out = tmp_path / "model"
    assert run(main, ["--run", str(tiny_run), "--out", str(out)]) == 0
    model, config, path = load_classifier(tiny_run)
    dataset = config.data.dataset_dir
    manifest = open_dataset(dataset, splits=["test"], required=["test"])
    graph = max(
        (g for _, g in read_split_graphs(dataset, manifest, "test")), key=lambda g: g.num_edges
    )
    (expected,) = score_graphs(model, [graph])  # the run's scores, as evaluate computes them
    np.savez(tmp_path / "graph.npz", **{k: getattr(graph, k) for k in INPUTS})

    done = subprocess.run(
        [sys.executable, "-c", PLAIN, str(out), str(tmp_path / "graph.npz"), str(tmp_path / "s")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []
    scores = np.load(tmp_path / "s.npy")
    assert scores.shape == (graph.num_edges,) and graph.num_edges > 100
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-5)
    assert b"Hvdtrack" not in (out / "saved_model.pb").read_bytes()  # no fused kernel op
    info = json.loads((out / EXPORT_INFO).read_text())
    assert (info["checkpoint"], info["checkpoint_path"]) == ("best", path)
    assert f"ckpt-{info['step']}" == Path(path).name
    assert info["data.graph"]["pt_min"] == config.data.graph.pt_min

    import onnxruntime
    import tf2onnx

    loaded = tf.saved_model.load(str(out))  # kept: the signature refers to its variables
    serve = loaded.signatures["serving_default"]
    specs = [tf.TensorSpec(s.shape, s.dtype, k) for k, s in _inputs(serve).items()]
    proto, _ = tf2onnx.convert.from_function(
        tf.function(lambda *x: serve(**dict(zip(INPUTS, x)))), input_signature=specs, opset=17
    )
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (onnx_scores,) = session.run(None, {k: getattr(graph, k) for k in INPUTS})
    np.testing.assert_allclose(onnx_scores, scores, rtol=0, atol=1e-5)


def _inputs(serve):
    """The signature's input specs, in ``INPUTS`` order."""
    specs = serve.structured_input_signature[1]
    return {k: specs[k] for k in INPUTS}
