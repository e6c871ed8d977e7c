"""``sacctmgr show assoc | qos | user`` (``--parsable2 --noheader``) -> :class:`SiteLimits`.

Pure, golden-tested on output recorded from the dev cluster with slurmdbd
(``slurm/record-golden-limits``). Each line has exactly the fields asked for, ``|``-separated
(``--parsable2``: no trailing separator); an empty field is no limit. A line with another
number of fields, a count that is not a whole number or a TRES without ``=`` is refused
with :class:`SlurmParseError` naming the line: the reader then keeps the last good limits.
Only node, GPU (``gres/gpu``, any type) and job counts are held; cpu, mem and the rest
are Slurm's to enforce on each single-node slot.
"""

from __future__ import annotations

from collections.abc import Mapping

from malletrain.core.accounting import Association, Qos, SiteLimits, TresLimit
from malletrain.slurm.errors import SlurmParseError

ASSOC_FIELDS = ("Cluster", "Account", "User", "Partition", "ParentName", "MaxTRES",
                "GrpTRES", "MaxJobs", "GrpJobs", "QOS", "DefaultQOS")
QOS_FIELDS = ("Name", "MaxTRESPU", "MaxJobsPU", "MaxTRESPA", "MaxJobsPA", "GrpTRES",
              "GrpJobs", "MaxTRES")
USER_FIELDS = ("User", "DefaultAccount")


def _command(what: str, fields: tuple[str, ...]) -> tuple[str, ...]:
    return ("sacctmgr", "--parsable2", "--noheader", "show", what,
            "format=" + ",".join(fields))


#: The three reads, every ``accounting.refresh_s`` (argument lists, never shell strings).
COMMANDS: Mapping[str, tuple[str, ...]] = {
    "assoc": _command("assoc", ASSOC_FIELDS),
    "qos": _command("qos", QOS_FIELDS),
    "users": _command("user", USER_FIELDS),
}
#: What sacctmgr says where the site runs no slurmdbd (recorded on 22.05): no limits then.
NO_ACCOUNTING_MARKERS = ("not running a supported accounting_storage plugin",)


def _rows(text: str, fields: tuple[str, ...], what: str) -> list[dict[str, str]]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != len(fields):
            raise SlurmParseError(
                f"sacctmgr show {what}, line {number}: {len(parts)} fields where "
                f"{len(fields)} were asked for ({','.join(fields)}): {line[:120]!r}")
        rows.append(dict(zip(fields, parts, strict=True)))
    return rows


def _count(text: str, where: str) -> int | None:
    if not text:
        return None
    if not text.isdigit():
        raise SlurmParseError(f"sacctmgr: {where} is {text!r}, not a whole number")
    return int(text)


def parse_tres(text: str, jobs: str = "", where: str = "TRES") -> TresLimit:
    """``node=3,gres/gpu=8,cpu=16`` (+ a job count) -> the node, GPU and job limits."""
    nodes = gpus = None
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        if not sep:
            raise SlurmParseError(f"sacctmgr: {where} item {item!r} has no '='")
        count = _count(value, f"{where} {name}")
        if name == "node":
            nodes = count
        elif name == "gres/gpu" or name.startswith("gres/gpu:"):
            gpus = count if gpus is None or count is None else min(gpus, count)
    return TresLimit(nodes=nodes, gpus=gpus, jobs=_count(jobs, f"{where} jobs"))


def _tighter(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def parse_assoc(text: str, cluster: str = "") -> tuple[Association, ...]:
    """The associations of ``cluster`` (``""``: the output must name one cluster only)."""
    rows = _rows(text, ASSOC_FIELDS, "assoc")
    names = sorted({r["Cluster"] for r in rows})
    if not cluster and len(names) > 1:
        raise SlurmParseError(
            f"sacctmgr show assoc lists clusters {', '.join(names)}: set "
            "accounting.cluster to the one the daemon scavenges")
    out = []
    for r in rows:
        if cluster and r["Cluster"] != cluster:
            continue
        where = f"assoc {r['Account']}/{r['User'] or '-'}"
        group = parse_tres(r["GrpTRES"], r["GrpJobs"], f"{where} GrpTRES")
        if r["User"]:  # a user's MaxJobs bounds that user's running jobs together
            group = TresLimit(group.nodes, group.gpus,
                              _tighter(group.jobs, _count(r["MaxJobs"], f"{where} MaxJobs")))
        out.append(Association(
            account=r["Account"], user=r["User"], partition=r["Partition"],
            parent=r["ParentName"], per_job=parse_tres(r["MaxTRES"], "", f"{where} MaxTRES"),
            total=group, qos=tuple(q for q in r["QOS"].split(",") if q),
            default_qos=r["DefaultQOS"]))
    return tuple(out)


def parse_qos(text: str) -> dict[str, Qos]:
    out = {}
    for r in _rows(text, QOS_FIELDS, "qos"):
        where = f"qos {r['Name']}"
        out[r["Name"]] = Qos(
            name=r["Name"],
            per_user=parse_tres(r["MaxTRESPU"], r["MaxJobsPU"], f"{where} MaxTRESPU"),
            per_account=parse_tres(r["MaxTRESPA"], r["MaxJobsPA"], f"{where} MaxTRESPA"),
            total=parse_tres(r["GrpTRES"], r["GrpJobs"], f"{where} GrpTRES"),
            per_job=parse_tres(r["MaxTRES"], "", f"{where} MaxTRES"))
    return out


def parse_users(text: str) -> dict[str, str]:
    """user -> default account."""
    return {r["User"]: r["DefaultAccount"] for r in _rows(text, USER_FIELDS, "user")}


def parse_limits(texts: Mapping[str, str], cluster: str = "",
                 user_max_nodes: int | None = None) -> SiteLimits:
    """The three answers of :data:`COMMANDS`, by key, -> the site's limits."""
    missing = sorted(set(COMMANDS) - set(texts))
    if missing:
        raise SlurmParseError(f"sacctmgr: no answer for {', '.join(missing)}")
    return SiteLimits(associations=parse_assoc(texts["assoc"], cluster),
                      qos=parse_qos(texts["qos"]), default_accounts=parse_users(texts["users"]),
                      user_max_nodes=user_max_nodes, from_accounting=True)
