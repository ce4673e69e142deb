"""hvdtrack: distributed GNN training for charged-particle tracking.

The package follows the data flow: ``events`` -> ``graphs`` -> ``records`` -> ``inputs`` ->
``model`` -> ``train`` -> ``scaling``.
"""

import os as _os

# TensorFlow prints an INFO banner from C++ at import; keep warnings and errors. Must be set
# before any stage module imports TensorFlow, hence here. An explicit setting wins.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

__version__ = "0.1.0"
