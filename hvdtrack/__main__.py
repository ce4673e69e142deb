"""``python -m hvdtrack``: the same as the ``hvdtrack`` command."""

import sys

from hvdtrack.cli import main

sys.exit(main())
