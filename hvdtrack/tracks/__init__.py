"""Tracks from edge scores and their physics metrics: the stage after the model scores segments.

``graph`` joins an event's section graphs (hits with positions, scored edges); ``chains`` builds
tracks from crossings (double hits together), mutual best edges and joins across missing layers
(``helix`` fits); ``building`` lists the builders (chains, connected components) and writes
submissions; ``truth`` reads an event's truth for scoring; ``matching``
holds the TrackML score and the track efficiency, fake and duplicate rates; ``plots`` draws the
evaluation figures. Numpy and pandas only (matplotlib for the plots).
"""
