"""The worker runtime: an ordinary training loop made elastic and checkpoint-free
(:mod:`.job`'s ``ElasticJob``; :mod:`.accelerate` for Hugging Face Accelerate; the
``torchrun --rdzv_backend=malletrain`` plugin in :mod:`.torchrun_rdzv`). Forming groups
(:mod:`.rendezvous`), moving state between processes (:mod:`.statesync`, :mod:`.transfer`),
the evicted-to-zero snapshot (:mod:`.snapshot`), SIGTERM handling (:mod:`.signals`,
:mod:`.watchdog`) and the background watcher (:mod:`.watcher`).

May import: :mod:`malletrain.elastic.protocol` and :mod:`malletrain.elastic.training`.
"""
