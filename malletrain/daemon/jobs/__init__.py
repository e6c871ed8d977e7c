"""A malleable job and its slot jobs as data: the spec the user asked for (:mod:`.spec`, read
from ``#SBATCH`` directives and flags by :mod:`.directives` with sbatch's own grammar in
:mod:`.sbatch_options`), what a slot job is and how it is rendered (:mod:`.slots`), and the
durable SQLite store of jobs, slots and their lifecycle (:mod:`.store`, :mod:`.store_rows`).

May import: core, slurm (parsers only) and :mod:`malletrain.elastic.restart`'s script
analysis. Every other room of the daemon builds on this one.
"""
