"""One tick's decision as a pipeline of pure steps (see :mod:`.decide` for the picture).

World (frozen observation) -> views -> screen -> pool -> allocate -> reconcile ->
membership -> TickPlan (actions for the actuator). No step does I/O.
"""

from malletrain.daemon.tick.actions import (
    Action,
    Cancel,
    ClearMarks,
    Extend,
    Hold,
    Leave,
    Park,
    Place,
    Publish,
    TickPlan,
    Transit,
)
from malletrain.daemon.tick.decide import decide
from malletrain.daemon.tick.world import CoordView, DecideSettings, JobModel, Registration, World

__all__ = [
    "Action", "Cancel", "ClearMarks", "CoordView", "DecideSettings", "Extend", "Hold",
    "JobModel", "Leave", "Park", "Place", "Publish", "Registration", "TickPlan", "Transit",
    "World", "decide",
]
