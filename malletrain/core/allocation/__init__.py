"""The Resource Allocator: what a job is worth at each node count (:mod:`.valuation`,
:mod:`.finish`, :mod:`.targets`, :mod:`.spread`), the exact counts that maximise it
(:mod:`.knapsack`, :mod:`.allocator`), node types (:mod:`.hetero`), which concrete nodes each
job gets (:mod:`.placement`) and a plan's check against the best that shrinks nobody
(:mod:`.plan_check`). Pure: part of core, shared by the daemon and the simulator.
"""
