"""The SavedModel of a run's classifier: one graph in, its edge scores out, plain TensorFlow ops.

The serving signature ``serving_default`` takes one graph, ``nodes`` float32 [N, 3] and
``edges`` float32 [E, 4] (the features of ``graphs.construction``, scaled as the run's
``data.graph`` says), ``senders`` and ``receivers`` int32 [E] (node indices, inner hit to outer
hit), and returns ``scores`` float32 [E] (sigmoid of the last step's logit, as ``evaluate``).
The model is traced under ``kernels.plain_ops`` (layer norms and segment sums in TensorFlow ops)
so the saved graph holds no custom op.
``EXPORT_INFO`` beside the model records the run, the checkpoint asked for and the one loaded
(``checkpoint_path``, its ``step``), and the graph config that makes its inputs.

Public symbols: ``EXPORT_INFO``, ``SIGNATURE``, ``export_run``, ``custom_ops``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tensorflow as tf
from graph_nets import graphs as gn_graphs

from hvdtrack.errors import ConfigError
from hvdtrack.evaluate.inference import check_output, load_classifier
from hvdtrack.model.kernels import plain_ops
from hvdtrack.records.schema import EDGE_FEATURE_SIZE, NODE_FEATURE_SIZE
from hvdtrack.train.checkpoints import number
from hvdtrack.utils.io import Staged, write_json

EXPORT_INFO = "hvdtrack-export.json"
SIGNATURE = "serving_default"
# Ops of TensorFlow's own op registry never start so; those of the kernel library
# (hvdtrack.model.kernels) do.
_CUSTOM_PREFIX = "Hvdtrack"


class _Serving(tf.Module):
    """The classifier behind a one-graph signature."""

    def __init__(self, model: tf.Module) -> None:
        super().__init__(name="hvdtrack_classifier")
        self.model = model

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, NODE_FEATURE_SIZE], tf.float32, name="nodes"),
            tf.TensorSpec([None, EDGE_FEATURE_SIZE], tf.float32, name="edges"),
            tf.TensorSpec([None], tf.int32, name="senders"),
            tf.TensorSpec([None], tf.int32, name="receivers"),
        ],
        autograph=False,  # the model's control flow is tf.cond / tf.while_loop (see Step)
    )
    def serve(self, nodes, edges, senders, receivers):
        graph = gn_graphs.GraphsTuple(
            nodes=nodes,
            edges=edges,
            senders=senders,
            receivers=receivers,
            globals=tf.zeros([1, 1], tf.float32),
            n_node=tf.shape(nodes)[:1],
            n_edge=tf.shape(edges)[:1],
        )
        return {"scores": tf.sigmoid(self.model(graph)[-1])}


def custom_ops(function) -> list[str]:
    """The op types of a concrete function's graph (nested functions too) that are not
    TensorFlow's: the fused kernels'."""
    graph_def = function.graph.as_graph_def()
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return sorted({n.op for n in nodes if n.op.startswith(_CUSTOM_PREFIX)})


def export_run(run_dir: str | Path, out: str | Path, checkpoint: str = "best") -> dict:
    """Writes the SavedModel of a run's classifier into ``out`` (replaced whole, renamed into
    place) and returns what ``EXPORT_INFO`` records.

    Raises:
      ConfigError: no run or checkpoint (``load_classifier``), a folder of ``out`` that cannot
        be written (checked first), or a traced graph that still
        holds a custom op (the export would not load elsewhere).
    """
    out = Path(out)
    check_output(out.parent, "--out")  # written beside, then renamed: before any work
    model, config, path = load_classifier(run_dir, checkpoint)
    serving = _Serving(model)
    with plain_ops():
        function = serving.serve.get_concrete_function()
    leaked = custom_ops(function)
    if leaked:
        raise ConfigError(f"{run_dir}: the traced classifier still uses custom ops {leaked}")
    info = {
        "run_dir": str(run_dir),
        "checkpoint": checkpoint,
        "checkpoint_path": path,
        "step": number(path),
        "signature": SIGNATURE,
        "inputs": {
            "nodes": ["float32", [None, NODE_FEATURE_SIZE]],
            "edges": ["float32", [None, EDGE_FEATURE_SIZE]],
            "senders": ["int32", [None]],
            "receivers": ["int32", [None]],
        },
        "outputs": {"scores": ["float32", [None]]},
        "data.graph": dataclasses.asdict(config.data.graph),
    }
    with Staged() as staged:
        tmp = staged.path(out, directory=True)
        with plain_ops():  # saving traces the function again, in its own context
            tf.saved_model.save(serving, str(tmp), signatures={SIGNATURE: function})
        write_json(tmp / EXPORT_INFO, info)
        staged.commit()
    return info
