"""``python -m hvdtrack``: the same as the ``hvdtrack`` command."""

import sys

from hvdtrack.cli import main

if __name__ == "__main__":
    sys.exit(main())
