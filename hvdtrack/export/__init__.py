"""A trained run's classifier outside hvdtrack: a TensorFlow SavedModel with a serving signature
(``hvdtrack export``; ``hvdtrack.export.__main__`` describes it)."""
