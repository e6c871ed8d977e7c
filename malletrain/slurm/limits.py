"""Slurm's limits on users, accounts and QOS, read every ``accounting.refresh_s``.

Why not every tick: associations and QOS change when an administrator runs ``sacctmgr``;
three ``sacctmgr`` calls (slurmdbd, not slurmctld) each tick would cost the database a
query per user of the site per tick for nothing. The reads run off the tick
(:class:`~malletrain.slurm.refresh.BackgroundRefresh`; only the very first one is waited
for), and only an answer that parses replaces the limits held: odd or garbled output, a
timeout or slurmdbd down keep the last good limits, with a warning, and are asked again a
period later. ``mode``: ``auto`` reads where the site runs slurmdbd (a cluster without it
answers that it runs no supported accounting_storage plugin: recorded in
``tests/golden/slurm/limits-off``), and stops after that answer; ``on`` always reads;
``off`` never. The settings' own per-user cap and share weights hold in every mode.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from malletrain.core.accounting import DEFAULT_FAIR_SHARE_FLOOR, SiteLimits, fair_share_weights
from malletrain.slurm.errors import SlurmCommandError, SlurmUnavailableError
from malletrain.slurm.parsers.parse_limits import COMMANDS, NO_ACCOUNTING_MARKERS, parse_limits
from malletrain.slurm.parsers.parse_sshare import COMMAND as SSHARE
from malletrain.slurm.parsers.parse_sshare import parse_sshare
from malletrain.slurm.refresh import BackgroundRefresh

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 20.0
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class NoAccountingError(SlurmCommandError):
    """The cluster runs no slurmdbd: there are no associations to read."""


class LimitsReader:
    """The site's limits as last read; :meth:`current` is what a tick holds."""

    def __init__(self, *, mode: str = "auto", refresh_s: float = 60.0, cluster: str = "",
                 user_max_nodes: int | None = None,
                 share_weights: Mapping[str, float] | None = None,
                 share_weights_from: str = "config",
                 fair_share_floor: float = DEFAULT_FAIR_SHARE_FLOOR,
                 account_weights: Mapping[str, float] | None = None,
                 run: Runner = subprocess.run,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.mode = mode
        self.refresh_s = refresh_s
        self.cluster = cluster
        self._run = run
        self._clock = clock
        self._fallback = SiteLimits(user_max_nodes=user_max_nodes,
                                    share_weights=dict(share_weights or {}),
                                    account_weights=dict(account_weights or {}))
        #: with ``share_weights_from: sshare``, the fair-share factors are read too
        self.commands = ({**COMMANDS, "sshare": SSHARE} if share_weights_from == "sshare"
                         else dict(COMMANDS))
        self.fair_share_floor = fair_share_floor
        self._limits: SiteLimits | None = None
        self._read_at: float | None = None
        self._asked_at: float | None = None
        #: False once ``auto`` found no accounting (never asked again)
        self.available = mode != "off"
        self._refresh = BackgroundRefresh(self._fetch, self._check, clock)
        self._told: Exception | None = None
        self._lock = threading.Lock()

    @property
    def last_error(self) -> Exception | None:
        return self._refresh.last_error

    def current(self) -> SiteLimits | None:
        """The limits a tick holds: the last good read (with the settings' cap and weights),
        else the settings' alone; None where neither limits anything. Starts a read when
        one is due (waits only for the first)."""
        with self._lock:
            self._maybe_read()
            return self.held()

    def holds_gpus(self) -> bool:
        """Whether the limits a tick holds count GPUs of running jobs together (then the
        tick's snapshot reads every job's GPUs): read before the snapshot is taken."""
        limits = self.current()
        return limits is not None and limits.holds_gpus

    def held(self) -> SiteLimits | None:
        """What :meth:`current` returned last, without reading (the submit channel's
        threads: ``--qos`` checked against the associations held)."""
        if self._limits is not None:
            return self._limits
        fb = self._fallback
        return (fb if fb.user_max_nodes is not None or fb.share_weights
                or fb.account_weights else None)

    def _maybe_read(self) -> None:
        if self.available:
            self._take()
            now = self._clock()
            if self._asked_at is None:
                self._asked_at = now
                self._refresh.start(self.commands, {})
                self._refresh.wait(READ_TIMEOUT_S * len(self.commands))
                self._take()
            elif now - self._asked_at >= self.refresh_s:
                self._asked_at = now
                self._refresh.start(self.commands, {})

    def _take(self) -> None:
        done = self._refresh.take()
        if done:
            texts = {k: text for k, (_, text) in done.items()}
            self._limits = self._with_weights(
                parse_limits(texts, self.cluster, self._fallback.user_max_nodes),
                texts.get("sshare"))
            self._read_at = min(t for t, _ in done.values())
        elif isinstance(self.last_error, NoAccountingError) and self.mode == "auto":
            log.info("accounting.mode auto: %s; Slurm's limits are not read",
                     self.last_error)
            self.available = False
        elif self.last_error is not None and self.last_error is not self._told:
            self._told = self.last_error  # once per failed read, not once per tick
            held = ("none yet" if self._read_at is None else
                    f"holding those of {self._clock() - self._read_at:.0f} s ago")
            log.warning("Slurm's limits not read (%s); %s", self.last_error, held)

    def _with_weights(self, limits: SiteLimits, sshare: str | None) -> SiteLimits:
        """The settings' weights on the limits read; with ``sshare``'s answer, each user's
        fair-share factor (floored) times its configured weight, and the floor for a user
        sshare does not list."""
        fb = self._fallback
        if sshare is None:
            return dataclasses.replace(limits, share_weights=fb.share_weights,
                                       account_weights=fb.account_weights)
        factors = fair_share_weights(parse_sshare(sshare), limits.default_accounts,
                                     self.fair_share_floor)
        weights = {u: f * fb.share_weights.get(u, 1.0) for u, f in factors.items()}
        return dataclasses.replace(limits, share_weights=weights,
                                   default_weight=self.fair_share_floor,
                                   account_weights=fb.account_weights)

    def _check(self, texts: Mapping[str, str]) -> None:
        parse_limits(texts, self.cluster)
        if "sshare" in texts:
            parse_sshare(texts["sshare"])

    def _fetch(self, commands: Mapping[str, Sequence[str]]) -> dict[str, str]:
        out = {}
        for key, argv in commands.items():
            try:
                res = self._run(list(argv), capture_output=True, text=True,
                                timeout=READ_TIMEOUT_S, check=False)
            except FileNotFoundError as exc:
                raise NoAccountingError(f"{argv[0]} is not installed") from exc
            except subprocess.TimeoutExpired as exc:
                raise SlurmUnavailableError(f"{' '.join(argv)}: no answer in "
                                            f"{READ_TIMEOUT_S:g} s") from exc
            if res.returncode != 0:
                err = res.stderr.strip()
                cls = (NoAccountingError if any(m in err for m in NO_ACCOUNTING_MARKERS)
                       else SlurmCommandError)
                raise cls(f"{' '.join(argv)}: exit {res.returncode}: {err[:300]}",
                          tuple(argv), res.stderr)
            out[key] = res.stdout
        return out
