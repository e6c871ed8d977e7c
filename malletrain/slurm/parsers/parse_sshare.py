"""``sshare --parsable2 --noheader --all --format=...`` -> :class:`FairShare` rows.

Pure, golden-tested on output recorded from the dev cluster with slurmdbd and
priority/multifactor on Slurm 22.05, 24.11 and 26.05 (``slurm/record-golden-sshare``).
The columns asked for exist under these names in all three (their ``--helpformat`` is kept
beside each recording). ``Account`` is indented by its depth in the fair-share tree (leading
spaces, stripped here); an account's own line has no ``User`` and no ``FairShare``;
``RawShares`` is ``parent`` for an association set to ``Fairshare=parent`` and empty on the
root's line. A line with another number of fields, a number that does not parse or a factor
outside [0, 1] is refused with :class:`SlurmParseError` naming the line: the reader then
keeps the last good factors.
"""

from __future__ import annotations

import math

from malletrain.core.accounting import FairShare
from malletrain.slurm.errors import SlurmParseError

FIELDS = ("Account", "User", "RawShares", "NormShares", "RawUsage", "EffectvUsage",
          "FairShare")
#: The read, every ``accounting.refresh_s`` where ``accounting.share_weights_from`` is
#: ``sshare`` (an argument list, never a shell string).
COMMAND: tuple[str, ...] = ("sshare", "--parsable2", "--noheader", "--all",
                            "--format=" + ",".join(FIELDS))


def _number(text: str, where: str, *, whole: bool = False) -> float:
    try:
        value = float(int(text)) if whole else float(text)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise SlurmParseError(f"sshare: {where} is {text!r}, not {kind}") from None
    if not math.isfinite(value) or value < 0:
        raise SlurmParseError(f"sshare: {where} is {text!r}, not a finite number >= 0")
    return value


def _row(line: str, number: int) -> FairShare:
    parts = line.split("|")
    if len(parts) != len(FIELDS):
        raise SlurmParseError(
            f"sshare, line {number}: {len(parts)} fields where {len(FIELDS)} were asked for "
            f"({','.join(FIELDS)}): {line[:120]!r}")
    account, user, raw, norm, usage, effective, factor = parts
    account = account.strip()
    where = f"line {number} ({account}/{user or '-'})"
    if not account:
        raise SlurmParseError(f"sshare, line {number}: no account: {line[:120]!r}")
    shares = None if raw in ("", "parent") else int(_number(raw, f"{where} RawShares",
                                                            whole=True))
    fair = None
    if factor:
        fair = _number(factor, f"{where} FairShare")
        if fair > 1:
            raise SlurmParseError(f"sshare: {where} FairShare is {factor!r}, above 1")
    return FairShare(
        account=account, user=user, raw_shares=shares,
        norm_shares=_number(norm, f"{where} NormShares") if norm else 0.0,
        raw_usage=int(_number(usage, f"{where} RawUsage", whole=True)) if usage else 0,
        effective_usage=_number(effective, f"{where} EffectvUsage") if effective else 0.0,
        factor=fair)


def parse_sshare(text: str) -> tuple[FairShare, ...]:
    """Every association's line, the tree's order kept (accounts before their users)."""
    return tuple(_row(line, number) for number, line in enumerate(text.splitlines(), 1)
                 if line.strip())
