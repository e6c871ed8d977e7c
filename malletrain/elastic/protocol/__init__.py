"""What both sides of a job's coordinator speak: the authenticated wire (:mod:`.wire`), a
session over it (:mod:`.authclient`, :mod:`.authstore`, a worker's :mod:`.link`), the store's
key layout (:mod:`.keys`) and its strictly checked records (:mod:`.records`, :mod:`.jobstore`),
and where a member belongs (:mod:`.config`, from its environment).

May import: nothing else in malletrain (besides :mod:`malletrain.errors`). Everything on the
wire is defined here once, so the coordinator, the worker and restart mode cannot disagree.
"""
