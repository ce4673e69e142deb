"""The segment classifier: a graph network scoring each hit-pair edge as a true track segment.

``config`` (``ModelConfig``, the ``model:`` section, no TensorFlow), ``classifier``
(``SegmentClassifier``, sparse graph_nets blocks), ``norm`` (the fused layer norm), ``kernels``
(the C++ CPU kernel library: layer norm, segment sum; built, cached, loaded), ``loss``
(``weighted_bce_terms``, ``weighted_bce``), ``metrics`` (edge metrics: AUC, efficiency, purity;
numpy only), ``cost`` (parameters, gradient bytes, FLOPs of a training step), ``precision``.
Nothing is imported here: ``import hvdtrack.model.config`` stays free of TensorFlow.
"""
