"""Trains the tiny config under Horovod with rank 1 made slow on purpose, for the accounting test.

  python tests/distributed/accounting_program.py CONFIG DATASET RUN_DIR {data|compute} SECONDS

``data``: rank 1's input pipeline hands over every batch ``SECONDS`` late (a slow reader).
``compute``: rank 1's forward/backward part of every step takes ``SECONDS`` longer (a slow rank).
Rank 0 is untouched; the test reads the run's timing records.
"""

import sys
import time

from hvdtrack.config import load_config
from hvdtrack.train.loop import fit
from hvdtrack.train.trainer import Trainer


class _Slower:
    """A compiled step part that takes ``delay`` seconds longer (traced like the original)."""

    def __init__(self, compiled, delay: float):
        self.compiled, self.delay = compiled, delay

    def __call__(self, *flat):
        out = self.compiled(*flat)
        time.sleep(self.delay)
        return out

    def get_concrete_function(self):
        return self.compiled.get_concrete_function()


def main() -> None:
    config_path, dataset, run_dir, slow, seconds = sys.argv[1:]
    delay = float(seconds)
    trainer = Trainer(
        load_config(
            config_path,
            [
                f"data.dataset_dir={dataset}",
                f"train.run_dir={run_dir}",
                "distributed.strategy=horovod",
                "train.progress_bar=false",
                "train.batch_graphs=1",
                "train.epochs=3",
            ],
        )
    )
    if trainer.workers.rank == 1:
        if slow == "data":
            batches = trainer.data.batches

            def slow_batches(epoch, first, steps_per_epoch):
                for batch in batches(epoch, first, steps_per_epoch):
                    time.sleep(delay)
                    yield batch

            trainer.data.batches = slow_batches
        else:
            trainer.step._local = _Slower(trainer.step._local, delay)
    fit(trainer)
    trainer.workers.shutdown()


if __name__ == "__main__":
    main()
