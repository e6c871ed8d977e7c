"""One tick's decision as a pipeline of pure steps (see :mod:`.decide` for the picture).

World (frozen observation) -> views -> screen -> pool -> allocate -> reconcile ->
membership -> TickPlan (actions for the actuator, :mod:`.actions`). No step does I/O.
"""

from malletrain.daemon.tick.actions import TickPlan
from malletrain.daemon.tick.decide import decide
from malletrain.daemon.tick.world import CoordView, DecideSettings, JobModel, Registration, World

__all__ = ["CoordView", "DecideSettings", "JobModel", "Registration", "TickPlan", "World",
           "decide"]
