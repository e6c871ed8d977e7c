"""The vendored data (data/README.md) is what its checksums say: the evaluation reads it."""

import hashlib
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"


def test_every_vendored_file_matches_its_checksum_and_none_is_unlisted():
    listed = {}
    for line in (DATA / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name] = digest
    present = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file()}
    assert present - set(listed) == {"README.md", "SHA256SUMS"}
    for name, digest in listed.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
