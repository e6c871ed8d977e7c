"""What training does at a given size, apart from membership: which samples each rank reads
(:mod:`.sampler`), how batch size and learning rate follow the world size (:mod:`.rules`),
how long each step waits on the all-reduce (:mod:`.synctime`) and gradient compression where
links are slow (:mod:`.compress`).

May import: nothing else in malletrain (besides :mod:`malletrain.errors`).
"""
