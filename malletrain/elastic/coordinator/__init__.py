"""The coordinator: a key-value server with one namespace per job (:mod:`.kvserver`,
:mod:`.kvspace`), its master key on disk (:mod:`.keyfile`), its command line (:mod:`.cli`)
and the daemon's typed handle on it (:mod:`.handle`, :mod:`.batchread`).

May import: :mod:`malletrain.elastic.protocol`. It never imports the worker runtime or torch:
it runs on the login node beside the daemon.
"""
