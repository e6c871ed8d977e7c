"""Other Slurm releases for the dev cluster: a Debian root file system per version.

Debian 12 (this machine) packages Slurm 22.05. Centres run newer releases, whose JSON
output has other shapes (docs/slurm-backend.md), so ``slurm/dev-cluster up --slurm-version
24.11`` (or 26.05) runs that release from the Debian suite that packages it:

* The root is made once with ``debootstrap --variant=minbase`` (about 300 MB, a few
  minutes) under ``$MALLETRAIN_SLURM_ROOTS`` (default ``/var/cache/malletrain/slurm-roots``)
  and reused; a ``.malletrain-ready`` file holds the Slurm version found inside.
* The daemons run with ``chroot ROOT`` inside the cluster's PID and mount namespace, where
  ``/proc``, ``/dev``, ``/sys``, ``/tmp``, ``/home``, the cluster's directory, this
  repository and the Python its ``.venv`` links to are bind-mounted at their own paths: the
  paths of slurm.conf, the munge socket, job scripts, their output and their interpreter
  are the same inside and outside.
* Clients (``sinfo``, ``sbatch``, ...) run on the host, as any user, through the root's own
  dynamic loader (``ROOT/lib64/ld-linux-x86-64.so.2 --library-path ...``): small wrappers in
  ``CLUSTER_DIR/bin`` that ``dev-cluster env`` puts first on ``PATH``. A chroot would need
  root, and tests run clients as the test users. ``--library-path`` outranks the binaries'
  RUNPATH, so they load the root's libslurm, never the host's.
* ``PluginDir`` in slurm.conf is the root's plugin directory as seen from the host; inside
  the root a symbolic link from that path to ``/`` makes the same path valid for the
  daemons, so one slurm.conf serves both.
* The host's munged serves both sides (munge's wire format has not changed).

Only the standard library is used: this runs before any virtualenv exists.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

#: The Slurm on this machine's own packages: no root file system needed.
HOST_VERSION = "22.05"
#: Debian suites that package each other release (checked in the root after bootstrap).
SUITES = {"24.11": "trixie", "26.05": "sid"}
VERSIONS = (HOST_VERSION, *SUITES)
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge")
#: What jobs running the host's Python (the repository's .venv, torch) load from the system:
#: the root is a minimal Debian, and jobs run inside it.
JOB_PACKAGES = ("libffi8", "libssl3t64", "libsqlite3-0", "libbz2-1.0", "liblzma5",
                "libgomp1", "libstdc++6", "libncursesw6", "libreadline8t64", "procps")
MIRROR = "http://deb.debian.org/debian"
READY = ".malletrain-ready"
#: Client commands given a wrapper (everything the project and its tests run).
CLIENTS = ("sinfo", "squeue", "scontrol", "sbatch", "scancel", "srun", "salloc", "sacct",
           "sacctmgr", "sdiag", "sprio", "sshare", "sstat")
LIB_DIRS = ("usr/lib/x86_64-linux-gnu/slurm-wlm", "usr/lib/x86_64-linux-gnu",
            "lib/x86_64-linux-gnu")
PLUGIN_DIR = "usr/lib/x86_64-linux-gnu/slurm-wlm"
REPO = Path(__file__).resolve().parents[1]


class RootError(RuntimeError):
    """The root file system for a Slurm version cannot be made or used."""


def roots_dir() -> Path:
    return Path(os.environ.get("MALLETRAIN_SLURM_ROOTS") or "/var/cache/malletrain/slurm-roots")


def check_version(version: str) -> str:
    if version not in VERSIONS:
        raise RootError(f"--slurm-version {version!r}: one of {', '.join(VERSIONS)}")
    return version


def root_for(version: str) -> Path | None:
    """The root file system of ``version``; ``None`` for the host's own Slurm."""
    return None if check_version(version) == HOST_VERSION else roots_dir() / version


def ensure_root(version: str, log: object = print) -> Path | None:
    """Make the root of ``version`` if it is missing (once; minutes), and return it."""
    root = root_for(version)
    if root is None:
        return None
    if (root / READY).exists():
        ensure_job_packages(root)
        return root
    if shutil.which("debootstrap") is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                        "debootstrap"], check=True,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    print(f"dev-cluster: making a Slurm {version} root ({SUITES[version]}) in {root}; "
          "a few minutes, once", file=sys.stderr, flush=True)
    subprocess.run(["debootstrap", "--variant=minbase",
                    f"--include={','.join(PACKAGES + JOB_PACKAGES)}",
                    SUITES[version], str(tmp), MIRROR], check=True,
                   stdout=subprocess.DEVNULL)
    found = installed_version(tmp)
    if not found.startswith(version + "."):
        raise RootError(f"{SUITES[version]} packages Slurm {found}, not {version}: "
                        f"update SUITES in {__file__}")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    (root / READY).write_text(f"{found}\n")
    ensure_job_packages(root)
    return root


def ensure_job_packages(root: Path) -> None:
    """Install :data:`JOB_PACKAGES` missing from ``root`` (a root made before they were
    listed gets them on its next use)."""
    res = subprocess.run(["chroot", str(root), "dpkg-query", "-W", "-f=${Package} ${Status}\n",
                          *JOB_PACKAGES], capture_output=True, text=True, check=False)
    have = {line.split()[0] for line in res.stdout.splitlines()
            if line.endswith("install ok installed")}
    missing = [p for p in JOB_PACKAGES if p not in have]
    if not missing:
        return
    print(f"dev-cluster: installing into {root}: {' '.join(missing)}", file=sys.stderr,
          flush=True)
    shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # the mirror's sid Release file may be past its Valid-Until (seen: "expired 19 d")
    apt = ["chroot", str(root), "apt-get", "-q", "-o", "Acquire::Check-Valid-Until=false"]
    subprocess.run([*apt, "update"], env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*apt, "install", "-y", "--no-install-recommends", *missing], env=env,
                   check=True, stdout=subprocess.DEVNULL)


def installed_version(root: Path) -> str:
    res = subprocess.run(["chroot", str(root), "dpkg-query", "-W", "-f=${Version}", "slurmctld"],
                         capture_output=True, text=True, check=True)
    return res.stdout.strip()


def prepare(root: Path, cluster_dir: Path) -> None:
    """Refresh what the root shares with the host, and write the client wrappers."""
    for name in ("passwd", "group", "hosts", "resolv.conf"):
        shutil.copyfile(f"/etc/{name}", root / "etc" / name)
    link = root / str(root).lstrip("/")  # ROOT/ROOT -> /: host paths into the root work inside
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to("/")
    for mount_point in mount_points(cluster_dir):
        for host_dir in [*reversed(mount_point.parents[:-1]), mount_point]:
            inside = root / str(host_dir).lstrip("/")
            inside.mkdir(exist_ok=True)
            # the same permissions as on the host (the root's own /root is 0700): jobs of the
            # test users must reach the repository and the venv's Python here too
            os.chmod(inside, host_dir.stat().st_mode & 0o7777)
    write_wrappers(root, cluster_dir / "bin")


def write_wrappers(root: Path, bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(bin_dir, 0o755)
    loader = root / "lib64" / "ld-linux-x86-64.so.2"
    libs = ":".join(str(root / d) for d in LIB_DIRS)
    for name in CLIENTS:
        target = root / "usr" / "bin" / name
        if not target.exists():
            continue
        path = bin_dir / name
        path.write_text(
            "#!/bin/sh\n# Written by slurm/dev-cluster: this cluster's Slurm, from its root.\n"
            f"exec {shlex.quote(str(loader))} --library-path {shlex.quote(libs)} "
            f"--argv0 {name} {shlex.quote(str(target))} \"$@\"\n"
        )
        os.chmod(path, 0o755)


def plugin_dir(root: Path) -> str:
    return str(root / PLUGIN_DIR)


def mount_points(cluster_dir: Path) -> list[Path]:
    """Host directories bind-mounted into the root at the same path: where jobs write,
    the repository, and the Python installation its virtualenv links to (so that jobs
    running malletrain's workers find the same interpreter and packages inside)."""
    points = [Path("/tmp"), Path("/home"), cluster_dir, REPO]
    venv_python = REPO / ".venv" / "bin" / "python"
    if venv_python.exists():
        points.append(venv_python.resolve().parents[1])
    out: list[Path] = []
    for p in points:
        if p.is_dir() and not any(p == q or q in p.parents for q in out):
            out.append(p)
    return out


def mount_all(root: Path, cluster_dir: Path) -> None:
    """Inside the cluster's own mount namespace (PID 1's): what the daemons must see."""
    mounts = [["mount", "-t", "proc", "proc", str(root / "proc")],
              ["mount", "--rbind", "/dev", str(root / "dev")],
              ["mount", "--rbind", "/sys", str(root / "sys")]]
    mounts += [["mount", "--rbind", str(p), str(root / str(p).lstrip("/"))]
               for p in mount_points(cluster_dir)]
    for argv in mounts:
        subprocess.run(argv, check=True)


def in_root(root: Path | None, argv: list[str]) -> list[str]:
    """``argv`` run inside ``root`` (unchanged for the host's own Slurm)."""
    return argv if root is None else ["chroot", str(root), *argv]
