"""``python -m hvdtrack.prepare [--config FILE|NAME] [--force] [section.key=value ...]``: events -> hit graphs -> TFRecord shards + manifest."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from hvdtrack.config import load_config, packaged_configs, resolve_config_path
from hvdtrack.distributed.config import launched_processes
from hvdtrack.entry import run
from hvdtrack.errors import ConfigError
from hvdtrack.prepare.local import prepare_dataset
from hvdtrack.prepare.mpi import Late, mpi_world, prepare_dataset_mpi


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvdtrack prepare", description=__doc__.splitlines()[0])
    p.add_argument(
        "--config",
        default=None,
        help="a YAML run configuration, or the name of a packaged one ("
        + ", ".join(packaged_configs())
        + "); default: the packaged 'default'",
    )
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    p.add_argument("--force", action="store_true", help="rebuild even if the dataset is up to date")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    config = load_config(resolve_config_path(args.config), args.overrides)
    comm = mpi_world()  # None unless started by mpirun/srun among other ranks
    launch = launched_processes()
    if comm is None and launch and launch[1] != 1:
        raise ConfigError(
            f"started by {launch[0]} as {launch[1] or 'several'} processes without MPI: each "
            f"would prepare {config.data.dataset_dir} on its own. Run python -m hvdtrack.prepare "
            "as one process, or under mpirun or srun --mpi=pmix (the ranks share the work)"
        )
    if comm is None:
        prepare_dataset(config, force=args.force, progress=not args.no_progress)
        return 0
    try:
        prepare_dataset_mpi(config, comm, force=args.force, progress=not args.no_progress)
    except Late as late:
        # A rank that neither reports nor fails cannot be told to stop: end the whole job.
        print(f"hvdtrack: error: {late}; aborting every rank", file=sys.stderr, flush=True)
        comm.Abort(4)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
