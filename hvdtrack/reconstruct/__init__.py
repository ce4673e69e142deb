"""Tracks from a trained run on any TrackML-format events, with or without truth
(``hvdtrack reconstruct``; ``hvdtrack.reconstruct.__main__`` describes it)."""
