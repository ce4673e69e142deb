"""``python -m hvdtrack.train --config FILE [section.key=value ...]``: train the segment classifier.

Under Horovod launch it as ``horovodrun -np 2 python -m hvdtrack.train --config ...
distributed.strategy=horovod`` (or with mpirun / srun); every rank runs this same command.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from hvdtrack.cli import guarded, quiet_tensorflow


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvdtrack train", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="YAML run configuration (configs/*.yaml)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    quiet_tensorflow()
    from hvdtrack.config import config_to_dict, load_config

    config = load_config(args.config, args.overrides)
    if args.print_config:
        print(json.dumps(config_to_dict(config), indent=2))
        return 0
    from hvdtrack.train.loop import train

    info = train(config)
    return 0 if info.get("status") == "finished" else 1


if __name__ == "__main__":
    sys.exit(guarded(main))
