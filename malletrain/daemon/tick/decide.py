"""One tick's decision: ``decide(world, policy) -> TickPlan``, a pipeline of pure steps.

Level-triggered (Ray autoscaler v2 style): the plan is recomputed from the WHOLE current
view every tick. Nothing depends on having seen an earlier event, so a restarted daemon, a
lost event or a half-applied tick is repaired by the next tick; a submission or a
cancellation only makes the next tick come sooner. The data flows one way::

    World ─► views ─► screen ─► pool ─► allocate ─► per job: reconcile ─► membership
             (slots)  (managed)  (windows, (policy:     (slot actions:    (publish,
                                 give-back) targets)    place, park...)   phases)

Jobs whose earlier actions are still being applied (``World.busy``) are pinned: the
policy does not see them or their nodes, their target is what they hold, and they get no
actions this tick.

The caller (:mod:`malletrain.daemon.service.daemon`) applies the actions through the actuator.
"""

from __future__ import annotations

from malletrain.core.allocation.shares import fair_turn
from malletrain.core.model import Policy
from malletrain.daemon.tick.actions import Action, TickPlan
from malletrain.daemon.tick.allocate import allocate, policy_jobs
from malletrain.daemon.tick.limits import (
    all_limits,
    limited_jobs,
    most_nodes,
    regular_usage,
    shared_caps,
)
from malletrain.daemon.tick.membership import membership_actions
from malletrain.daemon.tick.pool import build_pool
from malletrain.daemon.tick.reasons import entitlements, job_reasons, useful_most
from malletrain.daemon.tick.reconcile import JobContext, reconcile
from malletrain.daemon.tick.screen import screen
from malletrain.daemon.tick.views import job_slots
from malletrain.daemon.tick.world import World


def decide(world: World, policy: Policy) -> TickPlan:
    slots = job_slots(world)
    screened = screen(world, slots)
    pool = build_pool(world, screened.managed, slots)
    free = tuple(j for j in screened.managed if j.job_id not in world.busy)
    pinned = {j.job_id: pool.holdings.held[j.job_id] for j in screened.managed
              if j.job_id in world.busy}
    gpu_types = frozenset(n.node_type for n in pool.free + pool.held + pool.leaving
                          if n.node_type)
    limits = all_limits(screened.managed, world.limits,
                        regular_usage(pool.regular, world.limits))
    jobs = policy_jobs(world.now_s, free, slots, pool.holdings.held, world.models, gpu_types,
                       frozenset(pool.offered), limits)
    site = world.limits
    weights = ({j.user: site.weight(j.user) for j in screened.managed}
               if site is not None else None)
    account_weights = site.account_weights if site is not None else None
    parents = site.account_parents if site is not None and account_weights else None
    allocation = allocate(world.now_s, pool, jobs, policy, pinned, world.settings.node_prices,
                          shared_caps(limits, pinned), weights, account_weights, parents)
    actions: list[Action] = [a for a in screened.actions if a.job_id not in world.busy]
    notes = [n for js in slots.values() for n in js.changed] + list(pool.give_back.notes)
    windows = pool.windows
    for job in free:
        ctx = JobContext.of(world, job, allocation.targets.get(job.job_id, ()), windows,
                            pool.give_back.nodes)
        diff = reconcile(ctx, slots[job.job_id])
        actions += diff.actions
        notes += diff.notes
        actions += membership_actions(ctx, diff)
    return TickPlan(
        targets=allocation.targets, actions=tuple(actions),
        slot_views={jid: js.views for jid, js in slots.items()}, allocation=allocation.plan,
        free_nodes=pool.free, held_nodes=pool.held, hole_start_s=pool.hole_start_s,
        notes=tuple(notes), follow_up=pool.give_back.follow_up,
        reasons=job_reasons(screened.managed, allocation.targets, len(pool.offered),
                            screened.waiting, limited_jobs(limits, allocation.targets,
                                                           shared_caps(limits, {}))),
        entitled=entitlements(screened.managed, allocation.targets, len(pool.offered),
                              most_nodes(screened.managed, limits), weights,
                              {k: lim.account for k, lim in limits.items()},
                              account_weights,
                              fair_turn(world.now_s, getattr(policy, "fair_turn_s", 0.0)),
                              parents,
                              useful_most(jobs, getattr(policy, "fair_share_min_gain", 0.0))))
