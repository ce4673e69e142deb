"""hvdtrack: distributed GNN training for charged-particle tracking.

The package follows the data flow: ``events`` -> ``graphs`` -> ``records`` -> ``inputs`` ->
``model`` -> ``train`` -> ``scaling``.
"""

__version__ = "0.1.0"
