"""``python -m hvdtrack.train [--config FILE|NAME] [section.key=value ...]``: train the segment classifier.

Without ``--config`` it trains the packaged default configuration; a dataset that is missing is
prepared first. Under Horovod launch it as ``horovodrun -np 8 python -m hvdtrack.train`` (or with
mpirun / srun; every rank runs this same command).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Sequence

from hvdtrack.entry import choose_allocator, run


def parser() -> argparse.ArgumentParser:
    from hvdtrack.config import DEFAULT_CONFIG_NAME, packaged_configs

    p = argparse.ArgumentParser(
        prog="hvdtrack train",
        description=__doc__.splitlines()[0],
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE|NAME",
        help="a YAML run configuration, or the name of a packaged one ("
        + ", ".join(packaged_configs())
        + f"); default: the packaged '{DEFAULT_CONFIG_NAME}'",
    )
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    return p


def _epilog() -> str:
    from hvdtrack.config import DEFAULT_CONFIG_NAME, load_config, packaged_configs
    from hvdtrack.errors import HvdtrackError

    rows = []
    for name, path in packaged_configs().items():
        try:
            config = load_config(path)
            data_dir, run_dir = config.data.dataset_dir, config.train.run_dir
            rows.append(f"  {name:<9} dataset {data_dir:<20} run directory {run_dir}")
        except HvdtrackError as err:
            rows.append(f"  {name:<9} (does not load: {err})")
    default = packaged_configs().get(DEFAULT_CONFIG_NAME)
    try:
        data_dir = load_config(default).data.dataset_dir if default else "?"
    except HvdtrackError:
        data_dir = "?"
    return f"""\
defaults:
  configuration  the packaged '{DEFAULT_CONFIG_NAME}': {default}
  dataset        {data_dir} (its data.dataset_dir, relative to the current directory)

The dataset is prepared on first use: when data.dataset_dir does not exist yet, or was built
from another data config, training prepares it first (as `python -m hvdtrack.prepare` does).
Under horovodrun / mpirun / srun rank 0 prepares it and the other ranks wait, at most
data.prepare_timeout_s seconds (default 1800): the directory must be on a filesystem all
ranks share.

packaged configurations (--config NAME; configs/NAME.yaml in a checkout):
""" + "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    from hvdtrack.distributed.stop import PENDING

    with PENDING:  # a stop signal from now on is kept for the first step (train.stop)
        try:
            return _main(argv)
        finally:
            PENDING.received = None


def _main(argv: Sequence[str] | None) -> int:
    from hvdtrack.distributed.stop import PREEMPTED_EXIT_CODE

    args = parser().parse_args(argv)
    from hvdtrack.config import config_to_dict, load_config, resolve_config_path

    config = load_config(resolve_config_path(args.config), args.overrides)
    if args.print_config:
        print(json.dumps(config_to_dict(config), indent=2))
        return 0
    from hvdtrack.distributed.launch import check_start, ensure_dataset, resolve_model

    check_start(config)  # launcher and strategy agree, the model fits: before anything is written
    # Before anything initialises Horovod / MPI / tf.distribute (train() does).
    ensure_dataset(config)
    config = resolve_model(config)  # model.keep_edge_term: auto, for the dataset's graphs
    choose_allocator(config.model.memory_first)  # read at TensorFlow's first tensor, not before
    from hvdtrack.train.loop import train

    try:
        info = train(config)
    except Exception as err:
        failure = _peer_failure(err, config)
        if failure is None:
            raise
        raise failure from None
    if info.get("stopped_by") == "signal":
        return PREEMPTED_EXIT_CODE  # checkpointed on SIGTERM/SIGUSR1: rerun to resume
    # "stopped" by train.stop_after_steps is a planned end (e.g. before a batch job's limit).
    return 0 if info.get("status") in ("finished", "stopped") else 1


def _peer_failure(err: Exception, config):
    """tf.distribute's error when another worker failed or went silent (MultiWorker), as one
    line naming that worker; None for any other error. (Horovod's are handled by ``train``.)"""
    import tensorflow as tf

    from hvdtrack.distributed.launch import launcher_rank
    from hvdtrack.errors import TrainingError

    text = str(err)
    if not isinstance(err, tf.errors.OpError) or not (
        "Collective ops is aborted" in text
        or isinstance(err, (tf.errors.DeadlineExceededError, tf.errors.UnavailableError))
    ):
        return None
    # The task a heartbeat timeout is about is named just before it; otherwise the first task
    # named that is not this worker's own (the text often names its own task first).
    beat = re.search(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+) heartbeat timeout", text)
    tasks = re.findall(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)", text)
    own = _own_task()
    task = beat.groups() if beat else next((t for t in tasks if t != own), None)
    peer = f"{task[0]} {task[1]}" if task else "another worker"
    if "heartbeat timeout" in text:
        what = (
            f"{peer} sent no heartbeat for distributed.deadline_s "
            f"({config.distributed.deadline_s} s): stopped, hung or its host is gone"
        )
    elif "reset by peer" in text or "Socket closed" in text or "failed to connect" in text:
        what = f"{peer} is gone (its connection closed: killed or crashed)"
    else:
        first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
        what = f"a collective with {peer} failed ({first[:200]})"
    return TrainingError(
        f"rank {launcher_rank()}: {what}. See the other workers' output; rerun the same "
        "command to resume from the last checkpoint"
    )


def _own_task() -> tuple[str, str] | None:
    """This worker's (job, task index) from TF_CONFIG, as tf.distribute names it in errors."""
    from hvdtrack.distributed.launch import read_tf_config
    from hvdtrack.errors import ConfigError

    try:
        _, task = read_tf_config(os.environ.get("TF_CONFIG") or "{}")
        return (str(task["type"]), str(int(task["index"])))
    except (ConfigError, ValueError, KeyError, TypeError):
        return None


if __name__ == "__main__":
    sys.exit(run(main))
