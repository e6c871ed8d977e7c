"""The Scavenger's pure half: which nodes are idle and for how long each is predicted to stay
idle (:mod:`.scavenger`, :mod:`.holes`). Its input is a cluster snapshot from either backend.
"""
