"""hvdtrack: distributed GNN training for charged-particle tracking.

The package follows the data flow: ``events`` -> ``graphs`` -> ``records`` -> ``inputs`` ->
``model`` -> ``train`` -> ``scaling``.
"""

import os as _os

# TensorFlow prints an INFO banner from C++ at import; keep warnings and errors. Must be set
# before any stage module imports TensorFlow, hence here. An explicit setting wins.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# TensorFlow's default CPU allocator returns large buffers to the OS after every step; with graphs
# of ~10^5 edges that costs ~10^6 page faults per step (a third of the step). The caching (BFC)
# allocator keeps them: 1.3-1.6x faster steps (python -m hvdtrack.bench model --bfc-allocator).
_os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

__version__ = "0.1.0"
