"""Real sbatch is the oracle: every script of the corpus (tests/data/sbatch/) is submitted to
a real Slurm's ``sbatch``, whose job_submit.lua records what Slurm parsed and refuses the
job (slurm/dev-cluster's sbatch oracle: nothing is queued, no resources are needed), and
``malletrain submit --test-only --json`` must read the same nodes, time, GPUs per node, GPU
type, tasks per node and name, and refuse what sbatch refuses.

A small cluster of its own (2 nodes with typed fake GPUs, the types the corpus asks for),
on the release under test (``MALLETRAIN_TEST_SLURM_VERSION``, as the other Slurm tests).
Options that name a site's own partition, QOS, account or reservation are refused by this
cluster's slurmctld before the plugin sees them: such a script is submitted again with the
site's name replaced on the command line (which wins over ``#SBATCH``), changing nothing
that is compared.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from malletrain import cli
from malletrain.daemon.jobs.sbatch_options import SPANK_OPTIONS

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from devslots import free_port_base  # one way to find a dev cluster's ports  # noqa: E402

DEV_CLUSTER = REPO / "slurm" / "dev-cluster"
SLURM_VERSION = os.environ.get("MALLETRAIN_TEST_SLURM_VERSION", "22.05")  # as tests/conftest.py
CORPUS = REPO / "tests" / "data" / "sbatch"
ROWS = json.loads((CORPUS / "corpus.json").read_text())
TAG = "malletrain-sbatch-oracle:"
NO_VAL = {"4294967294", "4294967295", "65534", "65535", "0xfffffffe"}
#: refusals of this cluster's slurmctld that are about names only the script's site has
_SITE_NAMES = {"Invalid partition name": "--partition=batch", "Invalid qos": "--qos=",
               "Invalid account": "--account=", "Requested reservation is invalid":
               "--reservation="}


#: what sbatch takes and malletrain refuses still, each with its reason (docs/user-guide.md)
KNOWN_GAPS: tuple[str, ...] = ()


#: (what a newer sbatch says, what malletrain's warning says) where releases differ
RELEASE_DIFFERENCES = (("cpus_per_tres", "24.11 and later refuse"),
                       ("mutually exclusive", "26.05 refuses"),
                       ("without either --gpus or -n/--ntasks", "24.11 and later refuse"))


def _gpu_types() -> str:
    found = {"a100", "v100"}
    for row in ROWS:
        text = (CORPUS / row["file"]).read_text(errors="replace")
        found |= set(re.findall(r"gpu:([A-Za-z][A-Za-z0-9_]{0,31}):\d", text))
        found |= set(re.findall(r"--gpus(?:-per-(?:node|task))?[= ]([A-Za-z][A-Za-z0-9_]{0,31}):\d",
                                text))
    return ",".join(f"{t}:8" for t in sorted(found))


@pytest.fixture(scope="module")
def oracle() -> Iterator[dict[str, str]]:
    base = Path(tempfile.mkdtemp(prefix="malletrain-oracle-", dir="/tmp"))
    base.chmod(0o755)  # munged (its own user) must reach the cluster's socket
    env = dict(os.environ, MALLETRAIN_DEVCLUSTER_DIR=str(base / "cluster"),
               MALLETRAIN_DEVCLUSTER_PORT=str(free_port_base(16)))
    up = subprocess.run([str(DEV_CLUSTER), "up", "--nodes", "2", "--gpus", _gpu_types(),
                         "--users", "", "--slurm-version", SLURM_VERSION], env=env,
                        capture_output=True, text=True, timeout=600)
    assert up.returncode == 0, up.stderr
    env["SLURM_CONF"] = str(base / "cluster" / "etc" / "slurm.conf")
    if SLURM_VERSION != "22.05":  # that release's own clients (slurm/slurm_roots.py)
        env["PATH"] = f"{base / 'cluster' / 'bin'}:{env.get('PATH', os.defpath)}"
    env["WORK"] = str(base)
    try:
        yield env
    finally:
        subprocess.run([str(DEV_CLUSTER), "down"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


def _sbatch(env: dict[str, str], path: Path, name: str) -> tuple[dict[str, str] | None, str]:
    """What real sbatch parsed (None if it refused), and its message."""
    record = Path(env["MALLETRAIN_DEVCLUSTER_DIR"]) / "run" / "sbatch-oracle" / f"{name}.json"
    extra: list[str] = []
    for _ in range(len(_SITE_NAMES) + len(SPANK_OPTIONS)):
        res = subprocess.run(["sbatch", f"--comment={TAG}{name}", *extra, str(path)],
                             env=env, cwd=env["WORK"], capture_output=True, text=True,
                             timeout=60)
        if record.exists():
            return json.loads(record.read_text()), res.stderr
        spank = re.search(r"unrecognized option '(--[a-z-]+)", res.stderr)
        if spank and spank.group(1) in SPANK_OPTIONS:
            # a plugin option the site has and this cluster lacks: sbatch reads the rest
            # of the script the same without it (the copy is the oracle's input only)
            path = _without_option(path, spank.group(1))
            continue
        fix = next((opt for key, opt in _SITE_NAMES.items() if key in res.stderr), None)
        if fix is None or fix in extra:
            return None, res.stderr
        extra.append(fix)
    return None, res.stderr


def _without_option(path: Path, option: str) -> Path:
    out = path.with_name(path.name + ".nospank")
    lines = path.read_text().splitlines(keepends=True)
    out.write_text("".join(x for x in lines if not (x.startswith("#SBATCH") and option in x)))
    return out


def _num(value: str | None) -> int | None:
    return None if value is None or value in NO_VAL else int(value)


def _gpus(parsed: dict[str, str | None], nodes: int, tasks: int | None
          ) -> tuple[int, str | None]:
    """GPUs per node and type from Slurm's TRES strings (``gres:gpu:a100:4``; 24.11 writes
    ``gres/gpu:a100:4``)."""
    for key, scale in (("tres_per_node", 1), ("tres_per_task", tasks or 1),
                       ("tres_per_job", None)):
        text = parsed.get(key) or ""
        m = re.search(r"gres[:/]gpu(?::(\w*[A-Za-z_]\w*))?(?:[:=](\d+))?(?:,|$)", text)
        if m:
            count = int(m.group(2) or 1)  # ``gres:gpu``, ``gres:gpu:a100``: one GPU
            per_node = count * scale if scale is not None else count // max(nodes, 1)
            return per_node, m.group(1)
    return 0, None


def _ours(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    cli.main(["submit", "--test-only", "--json", str(path)])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("row", ROWS, ids=[r["file"] for r in ROWS])
def test_malletrain_reads_each_script_as_real_sbatch_does(row, oracle, capsys, monkeypatch):
    monkeypatch.setenv("MALLETRAIN_SOCKET", os.path.join(oracle["WORK"], "none.sock"))
    path = Path(oracle["WORK"]) / row["file"]
    shutil.copyfile(CORPUS / row["file"], path)
    _agrees(oracle, path, re.sub(r"[^A-Za-z0-9_.-]", "_", row["file"])[:60], capsys)


_RUN = "srun torchrun --nproc_per_node=2 t.py\n"
_N2 = "#!/bin/bash\n#SBATCH -N 2 "
#: sbatch's grammar at its edges (src/sbatch/opt.c: _opt_batch_script, get_argument; the
#: optional arguments of src/common/slurm_opt.c), each a script written for this test
GRAMMAR_PROBES = {
    "indented": "#!/bin/bash\n#SBATCH -N 2\n  #SBATCH -N 3\n\t#SBATCH --time=10\n" + _RUN,
    "no-space": "#!/bin/bash\n#SBATCH--nodes=3\n#SBATCH\t-t 5\n" + _RUN,
    "slurm-word": "#!/bin/bash\n#SLURM --nodes=2\n#SBATCH -t 7\n" + _RUN,
    "escapes": "#!/bin/bash\n#SBATCH -N 2 -J a\\#b # note\n#SBATCH -t 3\n" + _RUN,
    "quoted-hash": '#!/bin/bash\n#SBATCH --job-name="x #y" -N 2\n' + _RUN,
    "comments-between": "#!/bin/bash\n#SBATCH -N 2\n\n# set up\n#SBATCH -t 9\n" + _RUN,
    "after-command": "#!/bin/bash\n#SBATCH -N 2\nexport A=1\n#SBATCH -N 4\n" + _RUN,
    "word-glued": "#!/bin/bash\n#SBATCHX -N 2\n" + _RUN,
    "dos-breaks": "#!/bin/bash\r\n#SBATCH -N 2\r\n" + _RUN,
    "space-before-hashbang": " #!/bin/bash\n#SBATCH -N 2\n" + _RUN,
    "optional-values": "#!/bin/bash\n#SBATCH --exclusive=user -N 2\n#SBATCH --nice\n"
                       "#SBATCH --no-kill=off --kill-on-invalid-dep=yes\n" + _RUN,
    "optional-value-bad": "#!/bin/bash\n#SBATCH --exclusive=everyone -N 2\n" + _RUN,
    "optional-not-next": _N2 + "--nice 50\n" + _RUN,
    "required-missing": _N2 + "--kill-on-invalid-dep\n" + _RUN,
    "short-eq-n": "#!/bin/bash\n#SBATCH -N=2\n" + _RUN,
    "short-eq-t": _N2 + "-t=10\n" + _RUN,
    "short-eq-j": _N2 + "-J=abc\n" + _RUN,
    "cluster-flags": _N2 + "-Qv\n" + _RUN,
    "short-glued": "#!/bin/bash\n#SBATCH -N2 -t5 -Jabc\n" + _RUN,
    "long-space-eq": "#!/bin/bash\n#SBATCH --nodes 2 --time= 5\n" + _RUN,
    "gres-gpu-only": _N2 + "--gres=gpu\n" + _RUN,
    "ntasks-only": "#!/bin/bash\n#SBATCH -n 8 --ntasks-per-node=4\n" + _RUN,
    "gpus-type": _N2 + "--gpus=a100:4\n" + _RUN,
    "time-dh": _N2 + "-t 1-2\n" + _RUN,
    "time-ms": _N2 + "-t 90:30\n" + _RUN,
    "nodes-range": "#!/bin/bash\n#SBATCH -N 2-4\n" + _RUN,
    "nodes-k": "#!/bin/bash\n#SBATCH -N 2k\n" + _RUN,
    "tab-sep": "#!/bin/bash\n#SBATCH\t--nodes=2\t--time=5\n" + _RUN,
    "empty-directive": "#!/bin/bash\n#SBATCH\n#SBATCH -N 2\n" + _RUN,
    "uppercase": "#!/bin/bash\n#sbatch -N 3\n#SBATCH -N 2\n" + _RUN,
    "dependency-singleton": _N2 + "--dependency=singleton\n" + _RUN,
    "time-zero": _N2 + "-t 0\n" + _RUN,
    "gpus-per-node-zero": _N2 + "--gpus-per-node=0\n" + _RUN,
    "gres-gpu-zero": _N2 + "--gres=gpu:0\n" + _RUN,
    "time-seconds": _N2 + "-t 00:00:30\n" + _RUN,
    "gres-none": _N2 + "--gres=none\n" + _RUN,
    "time-days-hours": _N2 + "--time=7-0\n" + _RUN,
    "time-four-parts": _N2 + "-t 1:2:3:4\n" + _RUN,
    "gpus-per-task-times-tasks": _N2 + "--gpus-per-task=2 --ntasks-per-node=4\n" + _RUN,
    "export-none-signal-number": _N2 + "--export=NONE --signal=10@60\n" + _RUN,
    "nodes-twice": "#!/bin/bash\n#SBATCH --nodes=2 --nodes=3\n" + _RUN,
    "array": _N2 + "--array=0-3%2\n" + _RUN,
    "gpus-per-node-before-gres": _N2 + "--gpus-per-node=2 --gres=gpu:4\n" + _RUN,
    "gres-before-gpus-per-node": _N2 + "--gres=gpu:4 --gpus-per-node=2\n" + _RUN,
    "time-min": _N2 + "--time=1:00:00 --time-min=30\n" + _RUN,
    "ntasks-and-per-node": _N2 + "--ntasks-per-node=4 --ntasks=8\n" + _RUN,
    "gres-two-types": _N2 + "--gres=gpu:a100:2,gpu:v100:2\n" + _RUN,
    "time-minutes-seconds": _N2 + "-t 60:00\n" + _RUN,
    "time-five-parts": _N2 + "-t 1-00:00:00:00\n" + _RUN,
    "time-spaces": "#!/bin/bash\n#SBATCH -N 2 -t \" 30 \"\n" + _RUN,
    "time-sixty-minutes": _N2 + "--time=2:60:00\n" + _RUN,
    "ntasks-over-nodes": _N2 + "--ntasks=4\n" + _RUN,
    "ntasks-alone": "#!/bin/bash\n#SBATCH -n 8\n" + _RUN,
    "nodes-range-unlimited": "#!/bin/bash\n#SBATCH -N 2-3 --time=UNLIMITED\n" + _RUN,
    "cpus-per-gpu": _N2 + "--cpus-per-gpu=4 --gpus-per-node=2\n" + _RUN,
    "gpus-per-task-alone": "#!/bin/bash\n#SBATCH --gpus-per-task=1\n" + _RUN,
    "gpus-per-task-nodes": _N2 + "--gpus-per-task=1\n" + _RUN,
    "gpus-per-task-per-node": "#!/bin/bash\n#SBATCH --gpus-per-task=1 --ntasks-per-node=2\n" + _RUN,
    "gpus-per-node-and-per-task": _N2 + "--gpus-per-node=8 --gpus-per-task=4\n" + _RUN,
    "ntasks-per-gpu": _N2 + "--gpus-per-node=4 --ntasks-per-gpu=2\n" + _RUN,
    "gres-type-digit": _N2 + "--gres=gpu:1080ti:2\n" + _RUN,
    "get-user-env": _N2 + "--get-user-env\n" + _RUN,
    "no-such-option": _N2 + "--share\n" + _RUN,
    "input-environment": _N2 + "-t 10 -J from-script\n" + _RUN,
    "input-environment-bad": "#!/bin/bash\n#SBATCH -N 2\n" + _RUN,
}
#: sbatch's input environment, which wins over the script's #SBATCH lines
PROBE_ENVIRONMENT = {
    "input-environment": {"SBATCH_TIMELIMIT": "45", "SBATCH_JOB_NAME": "from-env",
                          "SBATCH_GPUS_PER_NODE": "1", "SBATCH_EXCLUSIVE": ""},
    "input-environment-bad": {"SBATCH_TIMELIMIT": "soon"},
}


@pytest.mark.parametrize("probe", sorted(GRAMMAR_PROBES))
def test_sbatchs_grammar_at_its_edges_is_read_as_real_sbatch_reads_it(probe, oracle, capsys,
                                                                     monkeypatch):
    monkeypatch.setenv("MALLETRAIN_SOCKET", os.path.join(oracle["WORK"], "none.sock"))
    path = Path(oracle["WORK"]) / f"probe-{probe}.sh"
    path.write_bytes(GRAMMAR_PROBES[probe].encode())
    environment = PROBE_ENVIRONMENT.get(probe, {})
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    _agrees({**oracle, **environment}, path, f"probe-{probe}", capsys)


def _agrees(oracle: dict[str, str], path: Path, name: str,
            capsys: pytest.CaptureFixture[str]) -> None:
    """malletrain reads ``path`` as real sbatch does, or refuses what sbatch refuses."""
    parsed, message = _sbatch(oracle, path, name)
    ours = _ours(path, capsys)
    if parsed is None:
        warned = " ".join(ours.get("warnings", []))
        if any(said in warned and key in message for key, said in RELEASE_DIFFERENCES):
            return  # a newer release refuses what 22.05 takes: said at submit
        assert ours["accepted"] is False, f"sbatch refused it ({message.strip()}); we did not"
        return
    if not ours["accepted"]:  # only where a known gap of ours is the reason
        assert all(any(gap in e for gap in KNOWN_GAPS) for e in ours["errors"]), \
            f"sbatch took it; we refused: {ours['errors']}"
        return
    minutes = _num(parsed["time_limit"])
    per_node = _num(parsed["ntasks_per_node"])
    tasks = _num(parsed["num_tasks"])
    # no node count: slurmctld fills -n tasks at --ntasks-per-node (job_mgr.c), one node else
    lo = _num(parsed["min_nodes"]) or (-(-tasks // per_node) if tasks and per_node else 1)
    hi = _num(parsed["max_nodes"]) or lo
    if per_node is None and tasks is not None and lo == hi:
        per_node = tasks // lo
    gpus, kind = _gpus(parsed, lo, per_node)
    want = {"min_nodes": lo, "max_nodes": hi, "time_s": None if minutes is None else
            minutes * 60, "gpus_per_node": gpus, "gpu_type": kind, "name": parsed["name"],
            "tasks_per_node": per_node}
    assert {k: ours.get(k) for k in want} == want
