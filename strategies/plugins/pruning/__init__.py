"""Model pruning (``strategy.pruning``): which coordinates of the model are kept and sent.

``none.py`` "none" (dense); ``prunefl.py`` "prunefl" (PruneFL, Jiang et al. 2022:
initial magnitude pruning, then adaptive re-pruning from the sites' squared
gradients); the mask and its wire form are in the wire kernel
(:mod:`strategies.wire.pruning_mask`); ``units.py`` the units a
structure prunes as one (weights or channels); ``pruning_round.py`` its round feature
(the train stage's side: compacted model, the mask down, re-pruning).
"""
