"""Run a command under two of malletrain.service's protections, as systemd 252 applies them.

There is no systemd PID 1 on the test machines, so ``tests/ops/test_prometheus.py`` starts
the daemon through this script:

* ``NoNewPrivileges=yes``: ``prctl(PR_SET_NO_NEW_PRIVS)``;
* ``MemoryDenyWriteExecute=yes``: the seccomp filter systemd installs for it
  (``seccomp_memory_deny_write_execute`` in systemd's ``seccomp-util.c``): ``mmap`` with
  PROT_WRITE|PROT_EXEC, ``mprotect``/``pkey_mprotect`` with PROT_EXEC and ``shmat`` with
  SHM_EXEC fail with EPERM.

Both are inherited across ``exec`` and by every child (the coordinator the daemon starts).
Usage: ``python harden_exec.py COMMAND [ARGS...]`` (x86-64 only, like the CI machines).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
LD_ABS, JEQ, AND, RET = 0x20, 0x15, 0x54, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, ALU|AND|K, RET|K
ALLOW, DENY = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
AUDIT_ARCH_X86_64 = 0xC000003E
SYS_MMAP, SYS_MPROTECT, SYS_SHMAT, SYS_PKEY_MPROTECT = 9, 10, 30, 329
PROT_WRITE, PROT_EXEC, SHM_EXEC = 2, 4, 0o100000
ARG2 = 16 + 8 * 2  # offsetof(struct seccomp_data, args[2]), low 32 bits

# (code, jump-if-true, jump-if-false, k); a jump skips that many instructions.
PROGRAM = [
    (LD_ABS, 0, 0, 4), (JEQ, 1, 0, AUDIT_ARCH_X86_64), (RET, 0, 0, DENY),  # 0-2
    (LD_ABS, 0, 0, 0),                                                       # 3: syscall nr
    (JEQ, 4, 0, SYS_MMAP),                                                   # 4 -> 9
    (JEQ, 6, 0, SYS_MPROTECT),                                               # 5 -> 12
    (JEQ, 5, 0, SYS_PKEY_MPROTECT),                                          # 6 -> 12
    (JEQ, 7, 0, SYS_SHMAT),                                                  # 7 -> 15
    (RET, 0, 0, ALLOW),                                                      # 8
    (LD_ABS, 0, 0, ARG2), (AND, 0, 0, PROT_WRITE | PROT_EXEC),               # 9-10
    (JEQ, 7, 6, PROT_WRITE | PROT_EXEC),                                     # 11 -> 19 / 18
    (LD_ABS, 0, 0, ARG2), (AND, 0, 0, PROT_EXEC), (JEQ, 4, 3, PROT_EXEC),    # 12-14
    (LD_ABS, 0, 0, ARG2), (AND, 0, 0, SHM_EXEC), (JEQ, 1, 0, SHM_EXEC),      # 15-17
    (RET, 0, 0, ALLOW),                                                      # 18
    (RET, 0, 0, DENY),                                                       # 19
]


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def main() -> None:
    if platform.machine() != "x86_64":
        sys.exit(f"harden_exec: the seccomp program is written for x86_64, not "
                 f"{platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    filters = (SockFilter * len(PROGRAM))(*[SockFilter(*ins) for ins in PROGRAM])
    prog = SockFprog(len(PROGRAM), filters)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        sys.exit(f"harden_exec: PR_SET_NO_NEW_PRIVS failed, errno {ctypes.get_errno()}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        sys.exit(f"harden_exec: PR_SET_SECCOMP failed, errno {ctypes.get_errno()}")
    os.execvp(sys.argv[1], sys.argv[1:])  # noqa: S606 - an argument list, no shell


if __name__ == "__main__":
    main()
