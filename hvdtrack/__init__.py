"""hvdtrack: distributed GNN training for charged-particle tracking.

The package follows the data flow: ``events`` -> ``graphs`` -> ``records`` -> ``inputs`` ->
``model`` -> ``train`` -> ``scaling``. Importing it sets nothing: each command applies its
process settings (TensorFlow's log level and allocator) when it starts (``hvdtrack.entry``).
"""

__version__ = "0.1.0"
