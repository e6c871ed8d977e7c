"""Whether a change to the allocator keeps its plans: a digest of every plan on a fixed set of
instances, recorded and checked.

A speed-up of the allocator must not change what it decides (ties included: which of equal
plans wins changed RICC's user-blind replay by 11 % once). This decides the instances of
``benchmarks/allocator.py``'s generator under the presets ``CORE``, ``REPLAY`` and ``LIVE`` at
5,000 x 500, 600 x 80 and 120 x 40, with 0, 7 and 50 users, each also typed (3 node types),
crowded (8 free nodes) and under Slurm's caps, plus the ``equal-share`` and ``freetrain``
baselines, one policy per series (its hole model learns across the series, as in the
daemon), and keeps each plan's SHA-256 (job -> its nodes, in order).

Usage: ``.venv/bin/python benchmarks/allocator_plans.py record|check [FILE]`` (default
``benchmarks/allocator_plans.json``); ``check`` prints how many plans differ and exits 1 if any.
Last line: ``allocator_plans instances=N differ=D``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from allocator import crowded, instance, typed, with_caps, with_users

from malletrain.core.model import AllocationInput, Policy
from malletrain.core.policies import CORE, LIVE, REPLAY, make_policy

DEFAULT = Path(__file__).resolve().parent / "allocator_plans.json"


def _digest(policy: Policy, inp: AllocationInput) -> str:
    plan = policy.decide(inp)
    text = json.dumps(sorted((j, list(n)) for j, n in plan.assignments.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def plans() -> Iterator[tuple[str, str]]:
    """(instance name, its plan's digest), in a fixed order."""
    for preset_name, preset in (("core", CORE), ("replay", REPLAY), ("live", LIVE)):
        for nodes, jobs in ((5000, 500), (600, 80), (120, 40)):
            for users in (0, 7, 50):
                pol = make_policy("malletrain", preset)
                for k in range(4):
                    inp = instance(nodes, jobs, k, jobs_seed=k % 2)
                    inp = with_users(inp, users) if users else inp
                    name = f"malletrain/{preset_name}/{nodes}x{jobs}/u{users}/{k}"
                    yield name, _digest(pol, inp)
                    variants = {"crowded": crowded(inp, 8), "caps": with_caps(inp, users or 3)}
                    if nodes < 5000:
                        variants["typed"] = typed(inp, ("a", "b", "c"), k)
                    for tag, var in sorted(variants.items()):
                        yield f"{name}/{tag}", _digest(pol, var)
    for name, sizes in (("equal-share", ((5000, 500), (600, 80), (120, 40))),
                        ("freetrain", ((120, 40), (60, 20)))):
        for nodes, jobs in sizes:
            for users in (0, 7):
                pol = make_policy(name, CORE)
                for k in range(3):
                    inp = instance(nodes, jobs, k, jobs_seed=k % 2)
                    inp = with_users(inp, users) if users else inp
                    yield f"{name}/{nodes}x{jobs}/u{users}/{k}", _digest(pol, inp)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("record", "check"):
        print(__doc__.split("\n\n")[-2], file=sys.stderr)
        return 2
    path = Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT
    got = dict(plans())
    if sys.argv[1] == "record":
        path.write_text(json.dumps(got, indent=0, sort_keys=True) + "\n")
        print(f"allocator_plans instances={len(got)} recorded={path}")
        return 0
    want = json.loads(path.read_text())
    differ = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    for name in differ[:10]:
        print(f"differs: {name}")
    print(f"allocator_plans instances={len(want)} differ={len(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
