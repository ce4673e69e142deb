"""``python -m hvdtrack.export --run RUN --out DIR``: a trained run's classifier as a TensorFlow SavedModel.

DIR (replaced whole) is a SavedModel whose serving signature ``serving_default`` scores one
graph: inputs ``nodes`` float32 [N, 3], ``edges`` float32 [E, 4], ``senders`` and ``receivers``
int32 [E]; output ``scores`` float32 [E]. Plain TensorFlow loads it, without hvdtrack:

  m = tf.saved_model.load(DIR)
  scores = m.signatures["serving_default"](nodes=..., edges=..., senders=..., receivers=...)["scores"]

The features are those of hvdtrack.graphs.construction, scaled by the run's data.graph
settings, which DIR/hvdtrack-export.json records. The layer norm is exported as plain
TensorFlow ops (not the fused CPU kernel), so other runtimes and converters can read the graph.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from hvdtrack.entry import run


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hvdtrack export",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run", required=True, help="a training run directory (train.run_dir)")
    parser.add_argument("--out", required=True, help="the SavedModel directory to write")
    parser.add_argument("--checkpoint", default="best", help="best, latest, or a checkpoint path")
    args = parser.parse_args(argv)
    from hvdtrack.export.savedmodel import export_run  # TensorFlow, after the command's settings

    info = export_run(args.run, args.out, args.checkpoint)
    print(
        f"[export] {info['run_dir']} ({info['checkpoint']}) -> {args.out}: SavedModel, "
        f"signature {info['signature']}(nodes, edges, senders, receivers) -> scores",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
