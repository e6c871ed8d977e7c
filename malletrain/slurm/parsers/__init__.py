"""Pure parsers of Slurm's output, 22.05 to 26.05: JSON (:mod:`.parse_json`, its value shapes
in :mod:`.shapes`), text (:mod:`.parse_text`, :mod:`.parse_plain_jobs`, :mod:`.parse_states`)
and the entry points the backends call (:mod:`.parse`). Text in, the domain model of
:mod:`malletrain.core.cluster` out, or a :class:`~malletrain.slurm.errors.SlurmParseError`.
"""
