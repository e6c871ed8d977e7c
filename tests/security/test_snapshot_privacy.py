"""Another user against a job's evicted-to-zero snapshot in the shared state directory
(issue 15, item 3): the directory is sticky and open to all (every job's user writes there),
so each job writes in a directory of its own there (0700, a name derived from the job's
secret) and each file protects itself too. mt-alice's job saves; mt-bob tries to read it,
replace it, and plant a newer one; alice's job must refuse his file and resume from her own.
And (issue 49) mt-bob takes the names of alice's next snapshot first: her save must not fail.
"""

from __future__ import annotations

import pwd
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

SAVE = r"""
import sys, torch
from pathlib import Path
from malletrain.elastic.worker import snapshot
secret = bytes.fromhex(sys.stdin.read().strip())
own = snapshot.private_dir(Path(sys.argv[1]), "m1", secret, create=True)  # as statesync does
p = snapshot.save(own, "m1", 40, {"model": {"w": torch.full((3,), 7.0)}}, secret)
print(p)
"""

LOAD = r"""
import sys
from pathlib import Path
from malletrain.elastic.worker import snapshot
secret = bytes.fromhex(sys.stdin.read().strip())
ref = snapshot.find_latest(snapshot.private_dir(Path(sys.argv[1]), "m1", secret, create=False),
                           "m1")
got = snapshot.load(ref, "m1", secret) if ref else None
print(ref.step if ref else None, None if got is None else float(got["model"]["w"][0]))
"""

ATTACK = r"""
import os, sys, shutil
from pathlib import Path
d, victim = Path(sys.argv[1]), Path(sys.argv[2])
out = []
for name, fn in (("read", lambda: victim.read_bytes()),
                 ("unlink", lambda: victim.unlink()),
                 ("replace", lambda: os.replace(d / "mine", victim))):
    if name == "replace":
        (d / "mine").write_bytes(b"MTSNAP1\n" + b"0" * 32 + b"junk")
    try:
        fn()
        out.append(name + ":done")
    except PermissionError:
        out.append(name + ":refused")
planted = d / "m1.step000000000900.mtsnap"  # newer than the victim's: would win on step
planted.write_bytes(b"MTSNAP1\n" + b"0" * 32 + b"x")
os.chmod(planted, 0o600)
print(" ".join(out))
"""


@pytest.fixture
def shared():
    """A sticky directory open to all, as the daemon prepares the snapshot directory."""
    path = Path(tempfile.mkdtemp(prefix="mt-snapshots-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_another_user_can_neither_read_swap_nor_plant_a_snapshot(dev_cluster, shared):
    secret = "5a" * 32
    res = dev_cluster.run(sys.executable, "-c", SAVE, str(shared), user="mt-alice",
                          input=secret)
    victim = res.stdout.strip().splitlines()[-1]
    res = dev_cluster.run(sys.executable, "-c", ATTACK, str(shared), victim, user="mt-bob")
    assert res.stdout.split() == ["read:refused", "unlink:refused", "replace:refused"]
    res = dev_cluster.run(sys.executable, "-c", LOAD, str(shared), user="mt-alice",
                          input=secret)
    assert res.stdout.split() == ["40", "7.0"]  # bob's newer file refused, hers resumed


SQUAT = r"""
import os, sys
from pathlib import Path
d = Path(sys.argv[1])
for name in ("m1.step000000000040.mtsnap", "m1", "m1.step000000000040.mtsnap.tmp"):
    (d / name).write_bytes(b"bob's")  # the names an evict-to-zero save could be guessed to use
    os.chmod(d / name, 0o644)
"""

INTRUDE = r"""
import os, sys
from pathlib import Path
own = Path(sys.argv[1])
try:
    (own / "m1.step000000000900.mtsnap").write_bytes(b"bob's")
    print("planted")
except PermissionError:
    print("refused")
"""


def test_another_users_files_of_the_same_names_do_not_stop_a_save(dev_cluster, shared):
    """Before: bob's file named like alice's next snapshot made her save fail with EPERM
    (``os.replace`` over another user's file in a sticky directory), uncaught at eviction:
    her training state was lost."""
    secret = "6b" * 32
    dev_cluster.run(sys.executable, "-c", SQUAT, str(shared), user="mt-bob")
    res = dev_cluster.run(sys.executable, "-c", SAVE, str(shared), user="mt-alice",
                          input=secret)
    saved = Path(res.stdout.strip().splitlines()[-1])
    own = saved.parent
    assert own.parent == shared and own.name.startswith("m1.") and len(own.name) == 3 + 32
    st = own.lstat()
    assert (st.st_mode & 0o7777, st.st_uid) == (0o700, pwd.getpwnam("mt-alice").pw_uid)
    # bob sees the name now, but cannot write there
    res = dev_cluster.run(sys.executable, "-c", INTRUDE, str(own), user="mt-bob")
    assert res.stdout.split() == ["refused"]
    res = dev_cluster.run(sys.executable, "-c", LOAD, str(shared), user="mt-alice",
                          input=secret)
    assert res.stdout.split() == ["40", "7.0"]
