"""Proven upper bounds on what any policy can make on one replay (:mod:`.bound`, LP in
:mod:`.bound_lp`, MILP in :mod:`.bound_milp`, inputs in :mod:`.bound_inputs`, command line in
:mod:`.cli_bound`): the yardstick the simulator's policies are measured against.
"""
