"""Step 6 of a tick: the job's next membership, and its phase from what is observed.

Newcomers are published once they have registered, batched over ``publish_batch_s`` so
that a job growing onto 4 nodes changes its membership once, not 4 times, while it goes on
training on its current members. A native job with no live member (starting, or regrowing
after an eviction) trains on nothing while it waits, so its first newcomer is published at
once and the later ones join at a step boundary: the job trains from the first start-up
instead of the last. A restart-mode job still waits: each membership is a new generation of
the script (stop, checkpoint, start, load). A member asked to leave (or gone) is published
out at once. The job's phase follows what is seen: slots placed (starting), members
training (running), no node (evicted), no progress (stalled).
"""

from __future__ import annotations

from malletrain.core.lifecycle import JobPhase
from malletrain.daemon.tick.actions import Action, Publish, Transit
from malletrain.daemon.tick.reconcile import JobContext, SlotDiff

P = JobPhase


def next_membership(ctx: JobContext, d: SlotDiff) -> tuple[str, ...] | None:
    """The membership to publish now, or None to keep the current one."""
    current = list(ctx.cv.members)
    live_current = [m for m in current if m in d.survivors]
    ready = sorted(d.ready)
    newcomers = [m for _, m in ready]
    if d.leaving_needed or any(m not in ctx.cv.live for m in current):
        return tuple(live_current + newcomers)
    if not newcomers:
        return None
    # nothing trains while it waits: no batching, unless each change restarts the script
    idle = not live_current and ctx.job.spec.mode != "restart"
    if idle or d.waiting_for == 0 or ctx.now_s - ready[0][0] > ctx.settings.publish_batch_s:
        return tuple(live_current + newcomers)
    return None


def membership_actions(ctx: JobContext, d: SlotDiff) -> list[Action]:
    current = ctx.cv.members
    publish = next_membership(ctx, d)
    actions: list[Action] = []
    if publish is not None and set(publish) != set(current):
        actions.append(Publish(ctx.job.job_id, publish, len(current)))
    size_after = len(publish) if publish is not None else len(current)
    actions += phase_transitions(ctx, size_after, bool(d.covered) or d.waiting_for > 0)
    return actions


def phase_transitions(ctx: JobContext, size_after: int, slots_busy: bool) -> list[Transit]:
    job, cv, now = ctx.job, ctx.cv, ctx.now_s
    jid, state = job.job_id, job.state
    if state in (P.QUEUED, P.EVICTED) and slots_busy and size_after == 0:
        return [Transit(jid, P.STARTING, "slots placed on nodes")]
    if state in (P.QUEUED, P.EVICTED, P.STARTING) and size_after > 0:
        started = [Transit(jid, P.STARTING, "slots placed on nodes")] if state is P.QUEUED else []
        return [*started, Transit(jid, P.RUNNING, f"training on {size_after} node(s)")]
    if state in (P.RUNNING, P.STALLED) and size_after == 0 and not slots_busy:
        return [Transit(jid, P.EVICTED, "holds no node (training state kept)")]
    if state is P.STARTING and size_after == 0 and not slots_busy:
        trained = (cv.samples_total or 0) > 0 or job.samples_total > 0
        return [Transit(jid, P.EVICTED if trained else P.QUEUED, "no slot could be started")]
    since = job.lifecycle.since_s()
    heartbeat_s = ctx.settings.heartbeat_timeout_s
    if state is P.RUNNING and size_after > 0 and cv.members:
        last = cv.progress_at_s if cv.progress_at_s is not None else job.last_progress_s
        quiet = now - max(last or since, since)
        if quiet > heartbeat_s:
            return [Transit(jid, P.STALLED, f"no progress report for {quiet:.0f} s")]
    elif state is P.STALLED:
        if cv.progress_at_s is not None and cv.progress_at_s > since:
            return [Transit(jid, P.RUNNING, "progress reports resumed")]
        if now - since > 3 * heartbeat_s:
            return [Transit(jid, P.FAILED, f"hung: no progress for {now - since:.0f} s more")]
    return []
