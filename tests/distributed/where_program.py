"""Records where this rank runs, then becomes the given command (same process).

    python tests/distributed/where_program.py OUT_DIR python -m hvdtrack.train ...

Writes OUT_DIR/where-rank{R}.json: rank, host name, network namespace inode (``/proc/self/ns/net``)
and the addresses of this host, so a test can tell which "host" each rank really ran on.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def main() -> None:
    out, command = Path(sys.argv[1]), sys.argv[2:]
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    record = {
        "rank": rank,
        "host": socket.gethostname(),
        "netns_inode": os.stat("/proc/self/ns/net").st_ino,
        "addresses": addresses,
        "pid": os.getpid(),
    }
    (out / f"where-rank{rank}.json").write_text(json.dumps(record))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
