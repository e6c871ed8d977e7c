"""``benchmarks/allocator.py --against-commit REV``: this tree's decision time beside an older
commit's, alternated in one run (the machine is shared and noisy: only same-run ratios mean
much).

Each measurement is a fresh process running :data:`DRIVER` with ``PYTHONPATH`` set to one
tree: that tree's own ``benchmarks/allocator.py`` makes the instances (``instance(5000, 500,
seed + k, jobs_seed=seed)``, the same call in every version since the benchmark began) and
that tree's default policy decides them (``make_policy("malletrain", CORE)``, or
``MalleTrainPolicy()`` before the policy registry). This tree is timed twice: user-blind,
and with the jobs owned by 50 users in turn (the fair-share division), which older trees
cannot do. The older tree is checked out with ``git worktree`` and removed at the end.

Last line: ``allocator_vs p50_ms=<x> users_p50_ms=<y> other_p50_ms=<z> other=<rev>``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: argv: tree, decisions, seed, users (0: user-blind); prints the p50 in ms
DRIVER = r"""
import statistics, sys, time
sys.path.insert(0, sys.argv[1] + "/benchmarks")
import allocator as bench
try:
    from malletrain.core.policies import CORE, make_policy
    policy = make_policy("malletrain", CORE)
except ImportError:  # a tree from before the policy registry
    policy = bench.MalleTrainPolicy()
decisions, seed, users = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
inputs = [bench.instance(5000, 500, seed + k, jobs_seed=seed) for k in range(decisions + 1)]
if users:
    inputs = [bench.with_users(inp, users) for inp in inputs]
policy.decide(inputs[0])  # warm-up: imports, caches
ms = []
for inp in inputs[1:]:
    t0 = time.perf_counter()
    policy.decide(inp)
    ms.append((time.perf_counter() - t0) * 1000)
print(statistics.median(ms))
"""


def _p50_ms(tree: Path, decisions: int, seed: int, users: int) -> float:
    res = subprocess.run([sys.executable, "-c", DRIVER, str(tree), str(decisions), str(seed),
                          str(users)], env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                         cwd=tree,  # `python -c` puts the working directory first on sys.path
                         capture_output=True, text=True, timeout=1800, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"the decision benchmark in {tree} failed: {res.stderr[-2000:]}")
    return float(res.stdout.split()[-1])


def compare_with(rev: str, rounds: int, decisions: int, seed: int) -> None:
    """Alternate this tree (user-blind, 50 users) and ``rev`` ``rounds`` times; print each
    round and the medians of the rounds' p50s."""
    with tempfile.TemporaryDirectory(prefix="mt-allocator-vs-") as tmp:
        other = Path(tmp) / f"tree-{rev[:12]}"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(other),
                        rev], check=True, capture_output=True)
        got: dict[str, list[float]] = {"this": [], "users": [], "other": []}
        try:
            for r in range(rounds):
                got["other"].append(_p50_ms(other, decisions, seed, 0))
                got["this"].append(_p50_ms(REPO, decisions, seed, 0))
                got["users"].append(_p50_ms(REPO, decisions, seed, 50))
                print(f"round {r + 1}: {rev} p50 {got['other'][-1]:.1f} ms; this tree "
                      f"{got['this'][-1]:.1f} ms, with 50 users' shares "
                      f"{got['users'][-1]:.1f} ms", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(other)], check=False, capture_output=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"this tree / {rev}: {med['this'] / med['other']:.2f}x user-blind, "
          f"{med['users'] / med['other']:.2f}x with 50 users' shares "
          f"(medians of {rounds} rounds' p50s, {decisions} decisions each)")
    print(f"allocator_vs p50_ms={med['this']:.1f} users_p50_ms={med['users']:.1f} "
          f"other_p50_ms={med['other']:.1f} other={rev}")
