"""The gang environment contract: the ``PELOTON_*`` variables every task of a gang starts with.

Written once here and used by all three parties: the launcher (:mod:`peloton.placement.launcher`)
sets them on every task it launches, ``peloton-run`` (:mod:`peloton.collective.run`) sets them on
the ranks it starts by hand, and the collective runtime (:func:`peloton.collective.init`) boots
from them. Standard library only: :mod:`peloton.collective` imports it inside task containers.

- ``PELOTON_RANK``, ``PELOTON_GANG_SIZE``: the task's rank in its gang and the gang's size.
- ``PELOTON_LOCAL_RANK``/``SIZE``: its rank among the gang's tasks on its host, and their number.
- ``PELOTON_CROSS_RANK``/``SIZE``: its rank among the hosts that hold a task of its local rank,
  and their number (the ring between hosts of a hierarchical allreduce).
- ``PELOTON_PEERS``: ``host:port`` of every rank, in rank order (where each rank listens).
- ``PELOTON_JOB_ID``, ``PELOTON_INSTANCE_ID``, ``PELOTON_ATTEMPT_ID``: which task this is (set by
  the scheduler only), and ``PELOTON_PORT_<NAME>`` for each of its named ports.
- ``PELOTON_COLLECTIVE_TIMEOUT``, ``PELOTON_FUSION_THRESHOLD``: collective runtime settings
  (optional; ``peloton-run`` sets them from its flags).
- ``PELOTON_GENERATION``: the gang's generation (optional, 0 for a gang that never changes).
  Ranks connect only to peers of their own generation, so a stale rank fails fast.
- ``PELOTON_GANG_SECRET``: the secret every rank of the gang proves it holds when it connects
  to another (an HMAC-SHA256 challenge-response both ways; a connection that fails it is refused
  and the rank goes on waiting for its peers). The scheduler makes a new one for every launch of
  a gang (:func:`new_secret`), one per job for an elastic gang (every generation's members hold
  it; the generation is part of what the handshake authenticates); ``peloton-run`` one per run.
  Optional: without it connections are not authenticated (a runtime started by hand). Never
  logged or shown: :class:`GangEnv`'s repr leaves it out.

Elastic gangs (:mod:`peloton.collective.elastic`) learn their membership from a rendezvous
endpoint instead of ``PELOTON_RANK``/``PEERS`` (:mod:`peloton.collective.rendezvous`):

- ``PELOTON_RENDEZVOUS``: ``host:port`` of the gang's rendezvous endpoint.
- ``PELOTON_RENDEZVOUS_TOKEN``: the per-job secret the endpoint requires of every worker.
- ``PELOTON_ELASTIC_TIMEOUT``: seconds a worker waits for a generation of at least the gang's
  minimum size before it fails (optional; default 60).
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RANK = "PELOTON_RANK"
GANG_SIZE = "PELOTON_GANG_SIZE"
PEERS = "PELOTON_PEERS"
LOCAL_RANK = "PELOTON_LOCAL_RANK"
LOCAL_SIZE = "PELOTON_LOCAL_SIZE"
CROSS_RANK = "PELOTON_CROSS_RANK"
CROSS_SIZE = "PELOTON_CROSS_SIZE"
JOB_ID = "PELOTON_JOB_ID"
INSTANCE_ID = "PELOTON_INSTANCE_ID"
ATTEMPT_ID = "PELOTON_ATTEMPT_ID"
PORT_PREFIX = "PELOTON_PORT_"
COLLECTIVE_TIMEOUT = "PELOTON_COLLECTIVE_TIMEOUT"
FUSION_THRESHOLD = "PELOTON_FUSION_THRESHOLD"
GENERATION = "PELOTON_GENERATION"
GANG_SECRET = "PELOTON_GANG_SECRET"
RENDEZVOUS = "PELOTON_RENDEZVOUS"
RENDEZVOUS_TOKEN = "PELOTON_RENDEZVOUS_TOKEN"
ELASTIC_TIMEOUT = "PELOTON_ELASTIC_TIMEOUT"

# Where a rank sits in its gang: what peloton-run sets and a user may not override.
TOPOLOGY_VARS = (RANK, GANG_SIZE, PEERS, LOCAL_RANK, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE)

DEFAULT_TIMEOUT = 30.0
DEFAULT_FUSION_THRESHOLD = 64 << 20
DEFAULT_ELASTIC_TIMEOUT = 60.0


class GangEnvError(ValueError):
    """A missing or malformed variable; the message names it (the collective raises it as a
    CollectiveError)."""


@dataclass(frozen=True)
class Rank:
    """Where one rank of a gang sits among the gang's tasks and hosts."""

    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def topology(hosts: Sequence[str]) -> list[Rank]:
    """Each rank's local and cross rank for tasks on ``hosts`` (by rank, as placement gives
    them: a host's ranks are contiguous). Ranks with local rank k on different hosts form a
    cross group, numbered in the order their hosts first appear."""
    local_size = Counter(hosts)
    order = list(dict.fromkeys(hosts))
    out: list[Rank] = []
    seen: Counter[str] = Counter()
    for host in hosts:
        k = seen[host]
        seen[host] += 1
        group = [h for h in order if local_size[h] > k]
        out.append(Rank(k, local_size[host], group.index(host), len(group)))
    return out


@dataclass(frozen=True)
class GangEnv:
    """What one task is told about its gang; :meth:`to_env` and :meth:`from_env` are the two
    directions of the contract."""

    rank: int
    size: int
    # ``host:port`` of every rank, in rank order.
    peers: tuple[str, ...]
    local_rank: int = 0
    local_size: int = 1
    cross_rank: int = 0
    cross_size: int = 1
    # Which task this is (the scheduler's; empty/None from peloton-run).
    job_id: str = ""
    instance_id: int | None = None
    attempt_id: str = ""
    # Named ports: (name, port), in the spec's order.
    ports: tuple[tuple[str, int], ...] = ()
    # Collective runtime settings; None: not set (the runtime's defaults).
    timeout: float | None = None
    fusion_threshold: int | None = None
    # The gang's generation (elastic gangs re-form under increasing ones).
    generation: int = 0
    # The gang's secret (empty: connections are not authenticated); never in a repr.
    secret: str = field(default="", repr=False)

    @classmethod
    def at(cls, rank: int, size: int, peers: Sequence[str], where: Rank, **rest: Any) -> GangEnv:
        """The environment of ``rank`` whose local and cross ranks are ``where``."""
        return cls(
            rank=rank,
            size=size,
            peers=tuple(peers),
            local_rank=where.local_rank,
            local_size=where.local_size,
            cross_rank=where.cross_rank,
            cross_size=where.cross_size,
            **rest,
        )

    def to_env(self) -> dict[str, str]:
        """The variables, as strings."""
        env: dict[str, str] = {}
        if self.job_id:
            env[JOB_ID] = self.job_id
        if self.instance_id is not None:
            env[INSTANCE_ID] = str(self.instance_id)
        if self.attempt_id:
            env[ATTEMPT_ID] = self.attempt_id
        env[GANG_SIZE] = str(self.size)
        env[RANK] = str(self.rank)
        env[LOCAL_RANK] = str(self.local_rank)
        env[LOCAL_SIZE] = str(self.local_size)
        env[CROSS_RANK] = str(self.cross_rank)
        env[CROSS_SIZE] = str(self.cross_size)
        env[PEERS] = ",".join(self.peers)
        for name, port in self.ports:
            env[PORT_PREFIX + name.upper()] = str(port)
        if self.timeout is not None:
            env[COLLECTIVE_TIMEOUT] = f"{self.timeout:g}"
        if self.fusion_threshold is not None:
            env[FUSION_THRESHOLD] = str(self.fusion_threshold)
        if self.generation:
            env[GENERATION] = str(self.generation)
        if self.secret:
            env[GANG_SECRET] = self.secret
        return env

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        *,
        rank: int | None = None,
        size: int | None = None,
        peers: Sequence[str] | str | None = None,
        local_rank: int | None = None,
        local_size: int | None = None,
        cross_rank: int | None = None,
        cross_size: int | None = None,
        timeout: float | None = None,
        fusion_threshold: int | None = None,
        generation: int | None = None,
    ) -> GangEnv:
        """The topology and collective settings from ``environ``; an argument that is not None
        wins over its variable. Local rank and size default to 0 and 1, cross rank and size to
        what equal hosts would give, the timeout and fusion threshold to the runtime's defaults.
        GangEnvError names the first variable that is missing or malformed."""
        the_size = _int(environ, GANG_SIZE, size)
        the_rank = _int(environ, RANK, rank)
        if the_size < 1:
            raise GangEnvError(f"{GANG_SIZE}={the_size} must be at least 1")
        if not 0 <= the_rank < the_size:
            raise GangEnvError(f"{RANK}={the_rank} is outside a gang of {the_size}")
        entries = _peers(environ, peers, the_size)
        lrank = _int(environ, LOCAL_RANK, local_rank, 0)
        lsize = _int(environ, LOCAL_SIZE, local_size, 1)
        if not 0 <= lrank < lsize:
            raise GangEnvError(f"{LOCAL_RANK}={lrank} is outside {LOCAL_SIZE}={lsize}")
        return cls(
            rank=the_rank,
            size=the_size,
            peers=entries,
            local_rank=lrank,
            local_size=lsize,
            cross_rank=_int(environ, CROSS_RANK, cross_rank, the_rank // lsize),
            cross_size=_int(environ, CROSS_SIZE, cross_size, max(1, the_size // lsize)),
            job_id=environ.get(JOB_ID, ""),
            instance_id=int(raw) if (raw := environ.get(INSTANCE_ID, "")).isdigit() else None,
            attempt_id=environ.get(ATTEMPT_ID, ""),
            timeout=_positive(environ, COLLECTIVE_TIMEOUT, timeout, DEFAULT_TIMEOUT),
            fusion_threshold=int(
                _positive(environ, FUSION_THRESHOLD, fusion_threshold, DEFAULT_FUSION_THRESHOLD)
            ),
            generation=_int(environ, GENERATION, generation, 0),
            secret=environ.get(GANG_SECRET, ""),
        )

    def addresses(self) -> tuple[list[str], list[int]]:
        """The peers' hosts (IPv6 without brackets) and ports, in rank order."""
        split = [split_peer(i, entry) for i, entry in enumerate(self.peers)]
        return [h for h, _ in split], [p for _, p in split]


def new_secret() -> str:
    """A fresh gang secret: 256 random bits as 64 hex digits."""
    return secrets.token_hex(32)


def split_peer(index: int, entry: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) of the peer at ``index``; GangEnvError if it is not one."""
    host, sep, port = entry.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise GangEnvError(f"{PEERS} entry {index} {entry!r} is not host:port (port 1-65535)")
    return host.strip("[]"), int(port)


def _int(
    environ: Mapping[str, str], var: str, given: int | None, default: int | None = None
) -> int:
    if given is not None:
        return int(given)
    raw = environ.get(var)
    if raw is None or raw.strip() == "":
        if default is None:
            raise GangEnvError(f"{var} is not set (pass it to init() or set the variable)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise GangEnvError(f"{var}={raw!r} is not an integer") from None


def elastic_timeout(environ: Mapping[str, str]) -> float:
    """``PELOTON_ELASTIC_TIMEOUT`` in seconds (positive), else the default."""
    return _positive(environ, ELASTIC_TIMEOUT, None, DEFAULT_ELASTIC_TIMEOUT)


def _positive(environ: Mapping[str, str], var: str, given: float | None, default: float) -> float:
    raw = str(given) if given is not None else environ.get(var)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise GangEnvError(f"{var}={raw!r} is not a number") from None
    if not value > 0:
        raise GangEnvError(f"{var}={raw!r} must be positive")
    return value


def _peers(
    environ: Mapping[str, str], peers: Sequence[str] | str | None, size: int
) -> tuple[str, ...]:
    if peers is None:
        raw = environ.get(PEERS)
        if not raw:
            raise GangEnvError(f"{PEERS} is not set (pass peers= to init() or set it)")
        peers = raw
    entries = [p.strip() for p in peers.split(",")] if isinstance(peers, str) else list(peers)
    if len(entries) != size:
        raise GangEnvError(f"{PEERS} lists {len(entries)} addresses for a gang of {size}")
    for i, entry in enumerate(entries):
        split_peer(i, entry)
    return tuple(entries)
