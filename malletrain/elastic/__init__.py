"""malletrain.elastic: checkpoint-free elastic training (worker runtime + coordinator).

Daemon side: :mod:`malletrain.elastic.coordinator` (``Coordinator``; env contract there).
Worker side: :mod:`malletrain.elastic.worker` (``ElasticJob``), see ``docs/elastic.md``.
Nothing here imports torch at package import time; the submodules do.
"""
