"""``TrainStep.compile``: traces every part and runs the local part once on a one-edge graph
(the runtime's first-call work done before any step), without changing what the run trains."""

import numpy as np

from hvdtrack.train.trainer import Trainer
from hvdtrack.utils.memory import rss_bytes, trim_heap


def test_compile_runs_the_local_part_and_changes_no_state(tiny_config):
    trainer = Trainer(tiny_config("distributed.backward_passes_per_step=2"))
    step, state = trainer.step, trainer.state
    tracked = state.variables + step.accumulators + [state.optimizer.step]
    before = [v.numpy().copy() for v in tracked]
    step.compile()
    for old, variable in zip(before, tracked):
        np.testing.assert_array_equal(variable.numpy(), old, err_msg=variable.name)
    assert step.trace_count() == 1  # the one-edge call ran the traced graph: no second trace


def test_trim_heap_gives_freed_heap_pages_back():
    blocks = [bytes(4000) for _ in range(20_000)]  # 80 MB of touched heap (below mmap's size)
    pin = bytes(4000)  # above them: freeing them leaves a hole, not a free top to shrink
    held = rss_bytes()
    del blocks
    assert trim_heap()
    assert held - rss_bytes() > 60 * 2**20
    del pin
