"""The Job Profiling Advisor: each job's throughput per node count learned online
(:mod:`.profiler`), a job kind's measured curve (:mod:`.profile`), the step's compute and
communication model (:mod:`.comm`) and cached answers (:mod:`.answers`). Pure: part of core.
"""
