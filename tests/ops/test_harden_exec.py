"""harden_exec.py really applies what it claims (the Prometheus test relies on it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HARDEN = Path(__file__).with_name("harden_exec.py")

PROBE = """
import ctypes, mmap
libc = ctypes.CDLL(None, use_errno=True)
print("no_new_privs", libc.prctl(39, 0, 0, 0, 0))
def refused(fn):
    try:
        fn()
    except OSError:
        return True
    return False
print("wx_mmap_refused", refused(lambda: mmap.mmap(-1, 4096, prot=7)))
print("rw_mmap_refused", refused(lambda: mmap.mmap(-1, 4096, prot=3)))
buf = mmap.mmap(-1, 4096, prot=3)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
print("mprotect_exec_refused", libc.mprotect(addr, 4096, 5) != 0)
print("mprotect_read_refused", libc.mprotect(addr, 4096, 1) != 0)
"""


def probe(*prefix: str) -> dict[str, str]:
    res = subprocess.run([*prefix, sys.executable, "-c", PROBE], capture_output=True,
                         text=True, timeout=60, check=True)
    return dict(line.split() for line in res.stdout.splitlines())


def test_without_it_nothing_is_refused():
    assert probe() == {"no_new_privs": "0", "wx_mmap_refused": "False",
                       "rw_mmap_refused": "False", "mprotect_exec_refused": "False",
                       "mprotect_read_refused": "False"}


def test_it_applies_no_new_privileges_and_memory_deny_write_execute():
    assert probe(sys.executable, str(HARDEN)) == {
        "no_new_privs": "1", "wx_mmap_refused": "True", "rw_mmap_refused": "False",
        "mprotect_exec_refused": "True", "mprotect_read_refused": "False",
    }
