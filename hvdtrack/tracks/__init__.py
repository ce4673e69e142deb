"""Tracks from edge scores and their physics metrics: the stage after the model scores segments.

``building`` joins an event's section graphs and builds tracks (connected components, or a
walkthrough that resolves branches); ``truth`` reads an event's truth for scoring; ``matching``
holds the TrackML score and the track efficiency, fake and duplicate rates; ``plots`` draws the
evaluation figures. Numpy and pandas only (matplotlib for the plots).
"""
