"""Helpers shared by the security tests."""

from pathlib import Path


def rss_mib(pid: int) -> float:
    """A process's resident memory in MiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0
