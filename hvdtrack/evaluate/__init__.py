"""Evaluation of a trained run: inference from its checkpoint (``inference``), the evaluation of a
split (``run``: edge scores, tracks per event (``tracking``), plots and TensorBoard
(``outputs``)), and its command line (``python -m hvdtrack.evaluate``)."""
