"""Input pipeline: epoch plans balancing edges over workers (``balance``, numpy only) and the
tf.data pipelines from shards to merged GraphsTuples (``pipeline``, imports TensorFlow), read
over several epochs by training (``epochs``)."""
