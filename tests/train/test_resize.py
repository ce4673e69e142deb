"""``Trainer.resize``: what follows from the worker count when it changes during a run (elastic
training), with the schedule continued at the same point of the run's epochs."""

import numpy as np

from hvdtrack.train.trainer import Trainer


def test_a_new_worker_count_keeps_the_schedule_where_the_run_is_in_its_epochs(tiny_config):
    config = tiny_config("train.epochs=6", "train.batch_graphs=1", "train.warmup_epochs=1")
    one = Trainer(config)
    assert (one.size.steps_per_epoch, one.size.global_batch) == (8, 1)  # 8 training graphs
    assert not one.resize()  # nothing changed: nothing rebuilt

    # Two epochs and one step on 1 worker, then the run goes on with 2 workers at the next epoch.
    one.state.optimizer.step.assign(2 * 8 + 1)
    one.state.epoch.assign(3)
    one.state.step_in_epoch.assign(0)
    one.workers.num_processes = 2
    assert one.resize()
    assert (one.size.steps_per_epoch, one.size.global_batch) == (4, 2)
    assert one.data.plan(3).num_steps == 4
    np.testing.assert_allclose(one.learning_rate, 0.01 * np.sqrt(2))
    # Epoch 3 of 6 on 2 workers is schedule step 3 * 4 = 12, whatever the optimizer counted.
    assert one.state.optimizer.schedule.offset == 12 - 17

    two = Trainer(tiny_config("train.epochs=6", "train.batch_graphs=1", "train.warmup_epochs=1"))
    two.workers.num_processes = 2
    two.resize()
    assert two.state.optimizer.schedule.offset == 0
    two.state.optimizer.step.assign(12)
    np.testing.assert_allclose(
        float(one.state.optimizer.learning_rate()),
        float(two.state.optimizer.learning_rate()),
        rtol=1e-6,
    )
    # The recompiled step applies the new schedule.
    assert two.step.trace_count() <= 1 and one.step.trace_count() <= 1
