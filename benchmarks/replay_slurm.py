"""A replayed Slurm at a supercomputer's size, answering the daemon's real CLI backend.

For ``benchmarks/load.py`` (and later load tests): the daemon runs unchanged, as a process,
with ``sinfo``, ``squeue``, ``scontrol``, ``scancel``, ``sbatch`` and ``sacctmgr`` on its
PATH replaced by small shims (:func:`write_shims`) that send their argv, stdin and
``SQUEUE_FORMAT`` to this server over a Unix socket and print its answer. So the daemon pays
what it pays on a real cluster (a subprocess per call, the output's parsing) and none of the
emulation's own work, which runs in the benchmark's process.

The answers have the shapes of Slurm 22.05 as recorded in ``tests/golden/slurm`` (a node
record of ``busy/nodes.json`` per node, the token-delimited job list, the partition, topology
and config texts), scaled to ``nodes`` nodes. Each answer waits ``latency_s`` first, like a
client round trip to a busy slurmctld.

The cluster it keeps: regular jobs of the ``batch`` partition that run, end, and are
followed by pending ones with a backfill plan (start time and nodes), which start on their
planned nodes and preempt scavenger jobs there; and the slot jobs of the ``scavenger``
partition that ``sbatch`` creates held, and the daemon places (``scontrol update NodeList=``,
``release``), parks (``requeuehold``), holds and cancels, with Slurm's states and reasons.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import socketserver
import stat
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from malletrain.slurm.hostlist import compress_hostlist

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "slurm" / "busy"
SECRET_RE = re.compile(r'"MALLETRAIN_JOB_SECRET": "([0-9a-f]{64})"')
TOOLS = ("sinfo", "squeue", "scontrol", "scancel", "sbatch", "sacctmgr")


@dataclass
class RJob:
    """One job as the replayed slurmctld keeps it."""

    job_id: int
    user: str
    partition: str
    state: str  # PENDING RUNNING COMPLETED PREEMPTED CANCELLED TIMEOUT
    nodes: int
    time_limit_min: int | None
    submit_s: float
    name: str = ""
    comment: str = ""
    held: bool = False
    requeued: bool = False
    node_list: tuple[str, ...] = ()
    start_s: float | None = None
    end_s: float | None = None
    #: the backfill plan of a pending regular job / the node a slot was placed on
    planned_start_s: float | None = None
    planned_nodes: tuple[str, ...] = ()
    restart_count: int = 0
    secret: str = ""


@dataclass
class Shape:
    """The replayed machine: its size, its load and how fast its regular jobs turn over."""

    nodes: int = 5000
    busy_fraction: float = 0.92
    pending_regular: int = 200
    regular_nodes: tuple[int, ...] = (1, 1, 2, 4, 8, 16, 32, 64)
    #: a regular job's run time: 10 min to 2 h, so that about one of the ~290 running jobs
    #: ends every 15 s (a production machine's turnover, not a compressed one)
    regular_run_s: tuple[float, float] = (600.0, 7200.0)
    latency_s: float = 0.05
    seed: int = 1


def _ts(t: float | None) -> str:
    return "N/A" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def _limit(minutes: int | None) -> str:
    if minutes is None:
        return "UNLIMITED"
    d, rest = divmod(minutes, 1440)
    h, m = divmod(rest, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:00"
    return f"{h}:{m:02d}:00" if h else f"{m}:00"


@dataclass
class ReplaySlurm:
    """The cluster's state and the commands' answers (thread-safe: one lock)."""

    shape: Shape
    clock: Callable[[], float] = time.time
    jobs: dict[int, RJob] = field(default_factory=dict)
    #: node -> the job running there (one job per node: exclusive)
    on_node: dict[str, int] = field(default_factory=dict)
    #: calls by the daemon (uid 0), by command ("scontrol update", "squeue"...)
    daemon_calls: dict[str, int] = field(default_factory=dict)
    #: jobs the daemon acted on (a line of an scontrol script, an id of a list, a scancel)
    daemon_acts: int = 0
    #: slot job ids requeued/preempted/ended since the workers last looked
    ended_slots: list[int] = field(default_factory=list)
    #: the submit notice slurm/job_submit.lua would write (None: not installed)
    notice: Path | None = None
    submissions: int = 0

    def __post_init__(self) -> None:
        self.lock = threading.RLock()
        self.rng = random.Random(self.shape.seed)
        self.names = [f"nid{i:05d}" for i in range(1, self.shape.nodes + 1)]
        #: nodes a pending job's plan names (one job each), and when each node was last busy
        self.planned: set[str] = set()
        start = self.clock()
        self.last_busy = {n: start - self.rng.uniform(0.0, 3600.0) for n in self.names}
        self._next_id = 1000
        template = json.loads((GOLDEN / "nodes.json").read_text())
        self._meta = template["meta"]
        self._node_template = template["nodes"][0]
        self._static = {
            "partitions": self._partitions(),
            "reservations": "No reservations in the system\n",
            "topology": "".join(
                f"SwitchName=s{k} Level=0 LinkSpeed=1 Nodes={','.join(self.names[k*36:(k+1)*36])}\n"
                for k in range((self.shape.nodes + 35) // 36)),
            "config": "PrivateData = none\nSlurmUser = slurm(64030)\n",
        }
        self._fill_regular()

    # -- the regular workload ------------------------------------------------------
    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _partitions(self) -> str:
        golden = (GOLDEN / "partitions.txt").read_text().splitlines()
        nodes = f"nid[00001-{self.shape.nodes:05d}]"
        return "".join(re.sub(r"Nodes=\S+", f"Nodes={nodes}", line) + "\n" for line in golden)

    def _fill_regular(self) -> None:
        now = self.clock()
        free = list(self.names)
        self.rng.shuffle(free)
        target = int(self.shape.busy_fraction * self.shape.nodes)
        while self.shape.nodes - len(free) < target:
            size = min(self.rng.choice(self.shape.regular_nodes), len(free))
            taken, free = free[:size], free[size:]
            run = self.rng.uniform(*self.shape.regular_run_s)
            started = now - self.rng.uniform(0.0, run)  # running for a while already
            self._start_regular(self._regular(size, started - 10.0), taken, started, run)
        for _ in range(self.shape.pending_regular):
            self._plan_regular(now)

    def _regular(self, size: int, submit_s: float) -> RJob:
        job = RJob(self._new_id(), f"user{self.rng.randrange(200):03d}", "batch", "PENDING",
                   size, 60, submit_s, name="regular")
        self.jobs[job.job_id] = job
        self._submitted()
        return job

    def _submitted(self) -> None:
        """What slurm/job_submit.lua does at a submission, where it is installed."""
        self.submissions += 1
        if self.notice is not None:
            self.notice.write_text(f"{int(self.clock())} {self.submissions}\n")

    def _start_regular(self, job: RJob, nodes: Sequence[str], now: float, run_s: float
                       ) -> None:
        job.state, job.node_list, job.start_s = "RUNNING", tuple(nodes), now
        job.end_s = now + run_s
        job.time_limit_min = int(run_s // 60) + 2
        job.planned_start_s, job.planned_nodes = None, ()
        for n in nodes:
            self.on_node[n] = job.job_id

    def _plan_regular(self, now: float) -> None:
        """A pending regular job planned, as backfill plans one, on the nodes of a running
        job when it ends, plus a few idle nodes held for it until then (the holes
        scavenging fills). No node is planned for two jobs."""
        running = [j for j in self.jobs.values() if j.state == "RUNNING"
                   and j.partition == "batch" and not self.planned.intersection(j.node_list)]
        if not running:
            return
        base = self.rng.choice(running)
        extra = self.rng.choice((0, 0, 0, 1, 2, 4))
        idle = [n for n in self.rng.sample(self.names, min(64, len(self.names)))
                if n not in self.planned and (self.on_node.get(n) is None
                                              or self.jobs[self.on_node[n]].partition != "batch")]
        nodes = (*base.node_list, *idle[:extra])
        # waiting for a while already (a busy machine's queue): Slurm started whatever it
        # could at submission; these wait for their plan
        job = self._regular(len(nodes), now - self.rng.uniform(600.0, 7200.0))
        job.planned_start_s, job.planned_nodes = base.end_s, nodes
        self.planned.update(nodes)

    def step(self) -> None:
        """Advance the cluster to now: regular jobs end and start, slots start and time out."""
        with self.lock:
            now = self.clock()
            for job in list(self.jobs.values()):
                if job.state == "RUNNING" and job.end_s is not None and job.end_s <= now:
                    self._end(job, "TIMEOUT" if job.partition == "scavenger" else "COMPLETED")
            for job in list(self.jobs.values()):
                if (job.state == "PENDING" and job.partition == "batch"
                        and job.planned_start_s is not None and job.planned_start_s <= now):
                    self._start_planned(job, now)
                elif (job.state == "PENDING" and job.partition == "scavenger" and not job.held
                      and job.planned_nodes):
                    self._start_slot(job, now)
            self._trim(now)

    def _end(self, job: RJob, state: str) -> None:
        job.state, job.end_s = state, self.clock()
        for n in job.node_list:
            if self.on_node.get(n) == job.job_id:
                del self.on_node[n]
                self.last_busy[n] = job.end_s
        if job.partition == "scavenger":
            self.ended_slots.append(job.job_id)

    def _start_planned(self, job: RJob, now: float) -> None:
        for n in job.planned_nodes:
            holder = self.on_node.get(n)
            if holder is not None:
                other = self.jobs[holder]
                if other.partition != "scavenger":
                    job.planned_start_s = now + 5.0  # its nodes are late: try again soon
                    return
        for n in job.planned_nodes:
            holder = self.on_node.get(n)
            if holder is not None:
                self._end(self.jobs[holder], "PREEMPTED")
        self.planned.difference_update(job.planned_nodes)
        self._start_regular(job, job.planned_nodes, now,
                            self.rng.uniform(*self.shape.regular_run_s))
        self._plan_regular(now)

    def _start_slot(self, job: RJob, now: float) -> None:
        node = job.planned_nodes[0]
        if node in self.on_node:
            return
        job.state, job.node_list, job.start_s = "RUNNING", (node,), now
        minutes = job.time_limit_min or 60
        job.end_s = now + 60.0 * minutes
        self.on_node[node] = job.job_id

    def _trim(self, now: float) -> None:
        """Ended regular jobs leave squeue after a while (MinJobAge)."""
        for jid in [j.job_id for j in self.jobs.values()
                    if j.partition == "batch" and j.state not in ("PENDING", "RUNNING")
                    and j.end_s is not None and now - j.end_s > 300.0]:
            del self.jobs[jid]

    # -- the commands --------------------------------------------------------------
    def answer(self, argv: Sequence[str], stdin: str, env: dict[str, str], uid: int
               ) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of one command, as Slurm 22.05 would print them."""
        name = argv[0]
        if uid == 0:
            key = f"{name} {argv[1] if len(argv) > 1 else 'script'}" if name == "scontrol" else name
            if name == "sinfo" and any(a.startswith("--Format") for a in argv):
                key = "sinfo states"
            if name == "squeue":  # the tick's job list, an attach's, the arrival probe's
                key = ("squeue pending" if "--states=PENDING" in argv
                       else "squeue jobs" if any(a.startswith("--jobs=") for a in argv)
                       else "squeue")
            self.daemon_calls[key] = self.daemon_calls.get(key, 0) + 1
            self.daemon_acts += _acts(argv, stdin)
        with self.lock:
            if name == "sinfo":
                if any(a.startswith("--Format") for a in argv):
                    return 0, self._node_states(), ""
                return 0, ("slurm 22.05.8\n" if "--version" in argv else self._nodes_json()), ""
            if name == "squeue":
                return 0, self._squeue(argv, env), ""
            if name == "sacctmgr":
                return 0, "root|Administrator\n", ""
            if name == "sbatch":
                return self._sbatch(argv, stdin, uid)
            if name == "scancel":
                return self._act(argv[-1], lambda j: self._cancel(j))
            if name == "scontrol" and len(argv) == 1:
                return self._scontrol_script(stdin)
            if name == "scontrol":
                return self._scontrol(list(argv[1:]))
        return 1, "", f"{name}: not replayed\n"

    def _nodes_json(self) -> str:
        planned = self.planned
        nodes = []
        for n in self.names:
            rec = dict(self._node_template)
            holder = self.on_node.get(n)
            rec.update(name=n, hostname=n, state="allocated" if holder else "idle",
                       last_busy=int(self.clock() if holder else self.last_busy[n]),
                       state_flags=["PLANNED"] if n in planned and not holder else [],
                       cpu_load=0)
            nodes.append(rec)
        return json.dumps({"meta": self._meta, "errors": [], "nodes": nodes})

    def _node_states(self) -> str:
        """``sinfo --noheader --Node --Format=NodeList:0|,StateComplete:0|``: one line per
        node and partition (each node is in both, as in ``busy/nodes.json``)."""
        lines = []
        for n in self.names:
            holder = self.on_node.get(n)
            state = ("allocated" if holder else
                     "idle+planned" if n in self.planned else "idle")
            lines.append(f"{n}|{state}|\n" * 2)
        return "".join(lines)

    def _squeue(self, argv: Sequence[str], env: dict[str, str]) -> str:
        if "--format=%A" in argv:
            return "".join(f"{j.job_id}\n" for j in self.jobs.values() if j.state == "PENDING")
        fmt = env.get("SQUEUE_FORMAT", "")
        token = fmt.split("%A", 1)[0]
        wanted = [a.split("=", 1)[1] for a in argv if a.startswith("--jobs=")]
        jobs = ([self.jobs[int(i)] for i in wanted[0].split(",") if int(i) in self.jobs]
                if wanted else self.jobs.values())
        return "".join(self._job_line(j, token) for j in jobs)

    def _job_line(self, j: RJob, token: str) -> str:
        pending = j.state == "PENDING"
        if pending and j.held:
            reason = "job requeued in held state" if j.requeued else "JobHeldUser"
        elif pending:
            reason = "Resources" if j.partition == "batch" else "Priority"
        else:
            reason = "None"
        start = j.planned_start_s if pending else j.start_s
        end = (j.planned_start_s + 60 * (j.time_limit_min or 0)
               if pending and j.planned_start_s else j.end_s)
        planned = _hostlist(j.planned_nodes) if pending and j.partition == "batch" else ""
        fields = (str(j.job_id), j.state, str(j.nodes), _limit(j.time_limit_min), _ts(start),
                  _ts(end), _ts(j.submit_s), j.user, j.partition,
                  "" if pending else _hostlist(j.node_list), planned or "(null)", reason)
        return f"{token}{'|'.join(fields)}{token}{j.name}{token}{j.comment or '(null)'}\n"

    def _sbatch(self, argv: Sequence[str], script: str, uid: int) -> tuple[int, str, str]:
        opts = dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)
        job = RJob(self._new_id(), _user(uid), opts.get("partition", "batch"), "PENDING", 1,
                   60, self.clock(), name=opts.get("job-name", ""),
                   comment=opts.get("comment", ""), held="--hold" in argv)
        m = SECRET_RE.search(script)
        job.secret = m.group(1) if m else ""
        self.jobs[job.job_id] = job
        self._submitted()
        return 0, f"{job.job_id}\n", ""

    def _act(self, ident: str, fn: Callable[[RJob], None]) -> tuple[int, str, str]:
        job = self.jobs.get(int(ident)) if ident.isdigit() else None
        if job is None:
            return 1, "", f"slurm_load_jobs error: Invalid job id specified ({ident})\n"
        fn(job)
        return 0, "", ""

    def _act_list(self, idents: str, fn: Callable[[RJob], None]) -> tuple[int, str, str]:
        """``scontrol release 1,2,3``: 22.05 acts on each id it can, names the others."""
        errors = []
        for ident in idents.split(","):
            job = self.jobs.get(int(ident)) if ident.isdigit() else None
            if job is None:
                errors.append(f"Invalid job id specified for job {ident}\n")
            else:
                fn(job)
        return (1 if errors else 0), "", "".join(errors)

    def _cancel(self, job: RJob) -> None:
        if job.state in ("PENDING", "RUNNING"):
            self._end(job, "CANCELLED")

    def _scontrol(self, args: list[str]) -> tuple[int, str, str]:
        if args[:2] == ["show", "partition"]:
            return 0, self._static["partitions"], ""
        if args[:2] == ["show", "reservation"]:
            return 0, self._static["reservations"], ""
        if args[:2] == ["show", "topology"]:
            return 0, self._static["topology"], ""
        if args[:2] == ["show", "config"]:
            return 0, self._static["config"], ""
        if args and args[0] == "update":
            kv = dict(a.split("=", 1) for a in args[1:] if "=" in a)
            return self._act(kv.get("JobId", kv.get("jobid", "")),
                             lambda j: self._update(j, kv))
        if len(args) == 2 and args[0] in ("release", "hold", "requeuehold"):
            return self._act_list(args[1], getattr(self, f"_{args[0]}"))
        return 1, "", f"scontrol {' '.join(args[:2])}: not replayed\n"

    def _scontrol_script(self, stdin: str) -> tuple[int, str, str]:
        """``scontrol`` reading its commands from stdin (the daemon's batched actions): it
        echoes each one on stdout, and an update it refuses names the job on stderr."""
        code, out, err = 0, [], []
        for line in stdin.splitlines():
            args = line.split()
            out.append(f"scontrol: {line}\n")
            rc, o, e = self._scontrol(args)
            if rc and args[:1] == ["update"]:
                ident = dict(a.split("=", 1) for a in args[1:] if "=" in a).get("JobId", "?")
                e = f"Invalid job id specified for job {ident}\n"
            code, _ = max(code, rc), out.append(o)
            err.append(e)
        return code, "".join(out), "".join(err)

    def _update(self, job: RJob, kv: dict[str, str]) -> None:
        if "NodeList" in kv:
            job.planned_nodes = (kv["NodeList"],)
        if "TimeLimit" in kv:
            job.time_limit_min = int(kv["TimeLimit"])
            if job.state == "RUNNING" and job.start_s is not None:
                job.end_s = job.start_s + 60.0 * job.time_limit_min

    def _release(self, job: RJob) -> None:
        job.held = False

    def _hold(self, job: RJob) -> None:
        if job.state == "PENDING":
            job.held = True

    def _requeuehold(self, job: RJob) -> None:
        if job.state == "RUNNING":
            self._end(job, "COMPLETED")
        job.state, job.held, job.requeued = "PENDING", True, True
        job.node_list, job.start_s, job.end_s = (), None, None
        job.restart_count += 1


def _user(uid: int) -> str:
    import pwd
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _hostlist(nodes: Sequence[str]) -> str:
    return compress_hostlist(nodes) if nodes else ""


# ------------------------------------------------------------------------- the server
class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        creds = self.connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                           struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        request = json.loads(self.rfile.readline())
        time.sleep(self.server.slurm.shape.latency_s)
        code, out, err = self.server.slurm.answer(request["argv"], request.get("stdin", ""),
                                                  request.get("env", {}), uid)
        self.wfile.write(json.dumps({"code": code, "out": out, "err": err}).encode() + b"\n")


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    slurm: ReplaySlurm


def serve(slurm: ReplaySlurm, path: Path) -> _Server:
    """Answer the shims on ``path`` (a thread per call) and advance the cluster 5x a second."""
    path.unlink(missing_ok=True)
    server = _Server(str(path), _Handler)
    server.slurm = slurm
    os.chmod(path, 0o666)  # the users' sbatch shims connect too
    threading.Thread(target=server.serve_forever, daemon=True, name="replay-slurm").start()

    def ticker() -> None:
        while True:
            time.sleep(0.2)
            slurm.step()

    threading.Thread(target=ticker, daemon=True, name="replay-step").start()
    return server


SHIM = '''#!{python} -IS
# malletrain benchmark: a replayed Slurm command (benchmarks/replay_slurm.py)
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect({path!r})
stdin = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
env = {{"SQUEUE_FORMAT": os.environ.get("SQUEUE_FORMAT", "")}}
argv = [os.path.basename(sys.argv[0])] + sys.argv[1:]
s.sendall(json.dumps({{"argv": argv, "stdin": stdin, "env": env}}).encode() + b"\\n")
data = b""
while not data.endswith(b"\\n"):
    chunk = s.recv(1 << 20)
    if not chunk:
        break
    data += chunk
answer = json.loads(data)
sys.stdout.write(answer["out"])
sys.stderr.write(answer["err"])
sys.exit(answer["code"])
'''


def _acts(argv: Sequence[str], stdin: str) -> int:
    """How many jobs a call of the daemon acts on (0 for a read)."""
    if argv[0] == "scancel":
        return 1
    if argv[0] != "scontrol" or argv[1:2] == ["show"]:
        return 0
    if len(argv) == 1:
        return sum(1 for line in stdin.splitlines() if line.strip())
    return len(argv[2].split(",")) if len(argv) > 2 and argv[1] != "update" else 1


def write_shims(bin_dir: Path, socket_path: Path, python: str = "/usr/bin/python3") -> None:
    """The replayed Slurm commands, for the front of PATH (readable by every user)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        shim = bin_dir / tool
        shim.write_text(SHIM.format(python=python, path=str(socket_path)))
        shim.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
