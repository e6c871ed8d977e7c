"""Per preempted restart-mode slot: slurmd's signal, the node agent's log lines after it, and
the slot's step and batch ends, in milliseconds from the signal.

``benchmarks/yield_trace.py`` says how long each slot held its node; this says where that
went on the agent's side (its log: "SIGTERM (N ms ago): stopping the tasks", "stopped in
X s (SIGTERM +a, SIGKILL +b)", "left the job"). It reads a kept run directory of
``benchmarks/corpus_e2e.py --keep``: the cluster's logs and the slots' ``slurm-<slot job>.out``
files (the agents' log, where a script gives no ``--output``)::

    python benchmarks/yield_agents.py /tmp/malletrain-corpus-e2e-XXXX
"""

from __future__ import annotations

import re
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from yield_trace import slot_ends

_AGENT = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) malletrain-agent \S+ (.*)$")
_OUT = re.compile(r"slurm-(\d+)\.out$")


def agent_lines(path: Path, from_t: float, to_t: float) -> list[tuple[float, str]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if m := _AGENT.match(line):
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if from_t <= t <= to_t:
                out.append((t, m.group(2)))
    return out


def main(argv: list[str]) -> int:
    base = Path(argv[1])
    outs = {int(m.group(1)): p for p in base.rglob("slurm-*.out") if (m := _OUT.search(p.name))}
    for e in slot_ends(base / "cluster" / "log"):
        if e.freed_t is None:
            continue
        step = f"{1000 * (e.step_done_t - e.signal_t):.0f}" if e.step_done_t else "-"
        path = outs.get(e.slurm_job_id)
        print(f"slot {e.slurm_job_id} on {e.node}: step 0 ended +{step} ms, batch "
              f"+{1000 * (e.freed_t - e.signal_t):.0f} ms ({path.name if path else 'no log'})")
        for t, msg in agent_lines(path, e.signal_t - 0.5, e.freed_t + 1) if path else []:
            print(f"    {1000 * (t - e.signal_t):6.0f} ms {msg[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
