"""Authorization: the rule of every RPC, in one table, and the checks the services make with it.

Each RPC needs a permission on some pool (README "Pools and permissions"): on the pool a request
names (CreateJob), on the pool of the job it names (the job RPCs, the sandbox reads), on the
parent of the pool it changes (CreatePool, UpdatePool, DeletePool), or on the cluster, the root
pool "/" (DrainHost, UndrainHost, ListAuditRecords); the rest need only a known caller. Whether a
caller holds a permission is decided by :mod:`peloton.core.access` from the grants of the pool
tree the daemon already serves (every daemon of several reads the stored tree), so any daemon
answers alike. The services call :meth:`Authorizer.check` with the target they read; the
authentication in front of them (the interceptor) has already refused unknown callers.

A daemon without authentication serves every RPC as the anonymous caller, which may do
everything: exactly as before permissions existed.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from peloton.api.caller import current_caller
from peloton.core.access import (
    ROOT,
    Permission,
    PoolGrants,
    Principal,
    allows,
    lineage,
    viewable,
)
from peloton.core.records import JobRecord
from peloton.errors import PermissionDenied
from peloton.resmgr.pool import PoolTree
from peloton.v1 import audit_pb2, host_pb2, job_pb2, pool_pb2, sweep_pb2

log = logging.getLogger(__name__)


class On(enum.Enum):
    """Where an RPC's permission is needed."""

    ANYONE = "any authenticated caller"
    CLUSTER = "the cluster"
    POOL = "the pool the request names"
    JOB = "the job's pool"
    PARENT = "the parent of the pool the request names"


@dataclass(frozen=True)
class Rule:
    """What a caller needs for one RPC: ``permission`` on the pool ``on`` names (nothing for
    ANYONE); a job's owner needs only ``owner_needs`` where it is set. ``action`` says what
    was refused: "{pool}" is the pool the request names or the job's, "{job}" the job."""

    on: On
    permission: Permission | None = None
    action: str = ""
    owner_needs: Permission | None = None


def method_name(service: str, method: str) -> str:
    """The full gRPC name of a method of a peloton service, as the interceptor sees it; raises
    KeyError for a method the descriptors do not have (a rule for a renamed RPC)."""
    for module in (job_pb2, pool_pb2, host_pb2, audit_pb2, sweep_pb2):
        found = module.DESCRIPTOR.services_by_name.get(service)
        if found is not None:
            return f"/{found.full_name}/{found.methods_by_name[method].name}"
    raise KeyError(service)


_VIEW_JOB = Rule(On.JOB, Permission.VIEW, "view job {job} in {pool}")
_ANYONE = Rule(On.ANYONE)

# The rule of every RPC the daemon serves, by full method name. tests/test_authz_rpc.py fails
# for an RPC without one, and calls each as callers with and without the permission it names:
# adding an RPC means deciding who may call it, and checking it in its servicer.
RULES: Mapping[str, Rule] = {
    method_name("JobService", "CreateJob"): Rule(On.POOL, Permission.SUBMIT, "submit to {pool}"),
    method_name("JobService", "GetJob"): _VIEW_JOB,
    # Lists only the jobs of pools the caller may view; a pool filter it may not view is refused.
    method_name("JobService", "ListJobs"): Rule(
        On.POOL, Permission.VIEW, "list the jobs of {pool}"
    ),
    method_name("JobService", "KillJob"): Rule(
        On.JOB, Permission.ADMIN, "kill job {job} in {pool}", owner_needs=Permission.SUBMIT
    ),
    method_name("JobService", "RestartJob"): Rule(
        On.JOB, Permission.ADMIN, "restart job {job} in {pool}", owner_needs=Permission.SUBMIT
    ),
    method_name("JobService", "DeleteJob"): Rule(
        On.JOB, Permission.ADMIN, "delete job {job} in {pool}", owner_needs=Permission.SUBMIT
    ),
    method_name("JobService", "GetTask"): _VIEW_JOB,
    method_name("JobService", "ListTasks"): _VIEW_JOB,
    method_name("JobService", "WatchJob"): _VIEW_JOB,
    method_name("PoolService", "CreatePool"): Rule(
        On.PARENT, Permission.ADMIN, "create pool {pool}"
    ),
    method_name("PoolService", "UpdatePool"): Rule(
        On.PARENT, Permission.ADMIN, "update pool {pool}"
    ),
    method_name("PoolService", "DeletePool"): Rule(
        On.PARENT, Permission.ADMIN, "delete pool {pool}"
    ),
    # The tree (paths, settings, grants, usage) is no secret among the cluster's users: each
    # needs it to know where to submit, and whom to ask for a grant.
    method_name("PoolService", "GetPool"): _ANYONE,
    method_name("PoolService", "ListPools"): _ANYONE,
    method_name("HostService", "ListHosts"): _ANYONE,
    method_name("HostService", "GetHost"): _ANYONE,
    method_name("HostService", "DrainHost"): Rule(On.CLUSTER, Permission.ADMIN, "drain hosts"),
    method_name("HostService", "UndrainHost"): Rule(On.CLUSTER, Permission.ADMIN, "undrain hosts"),
    method_name("HostService", "GetTaskLogs"): Rule(
        On.JOB, Permission.VIEW, "read the logs of job {job} in {pool}"
    ),
    method_name("HostService", "GetTaskGpus"): _VIEW_JOB,
    # The trail names every caller and what each did.
    method_name("AuditService", "ListAuditRecords"): Rule(
        On.CLUSTER, Permission.ADMIN, "read the audit trail"
    ),
    # Sweeps (README "Sweeps"): a sweep's trials are jobs in its pool, so it takes what its
    # jobs would; "{job}" names the sweep.
    method_name("SweepService", "SubmitSweep"): Rule(
        On.POOL, Permission.SUBMIT, "submit a sweep to {pool}"
    ),
    method_name("SweepService", "GetSweep"): Rule(On.POOL, Permission.VIEW, "view {job} in {pool}"),
    # Lists only the sweeps of pools the caller may view.
    method_name("SweepService", "ListSweeps"): _ANYONE,
    method_name("SweepService", "ListTrials"): Rule(
        On.POOL, Permission.VIEW, "view the trials of {job} in {pool}"
    ),
    method_name("SweepService", "KillSweep"): Rule(
        On.POOL, Permission.ADMIN, "kill {job} in {pool}", owner_needs=Permission.SUBMIT
    ),
    # Called by a trial's tasks: the servicer also requires the trial's report token, which
    # only they (and whoever may view the trial's job) hold.
    method_name("SweepService", "ReportMetrics"): _ANYONE,
}


class AuthzMetrics:
    """``peloton_permission_denied_total{permission}``: RPCs refused for want of a permission
    (``admin`` counts the cluster admin's too)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.denied = Counter(
            "peloton_permission_denied",
            "RPCs refused PERMISSION_DENIED, by the permission they needed.",
            ["permission"],
            registry=registry,
        )
        for permission in Permission:
            self.denied.labels(str(permission))


class Authorizer:
    """Decides the RPC being served by its rule, for the caller of the RPC
    (:func:`~peloton.api.caller.current_caller`), from the pool tree ``tree`` gives and the
    cluster's ``admins``. Thread-safe: it only reads an immutable tree."""

    def __init__(
        self,
        admins: frozenset[Principal],
        tree: Callable[[], PoolTree],
        metrics: AuthzMetrics | None = None,
    ) -> None:
        self._admins = admins
        self._tree = tree
        self._metrics = metrics
        # The grants of the last tree seen: a tree is never changed, only replaced.
        self._grants_of: tuple[PoolTree, PoolGrants] | None = None

    def _grants(self) -> tuple[PoolTree, PoolGrants]:
        tree = self._tree()
        known = self._grants_of
        if known is None or known[0] is not tree:
            known = (tree, {p: tree.get(p).grants for p in tree.paths()})
            self._grants_of = known
        return known

    def check(self, method: str, *, pool: str = "", job: str = "", owner: str = "") -> None:
        """Raise PermissionDenied unless the caller may call ``method`` on ``pool`` (the pool
        the request names, or the job's: then ``job`` is its id and ``owner`` its owner)."""
        denied = self._denied(method, pool, owner)
        if denied is None:
            return
        target, needs = denied
        rule = RULES[method]
        caller = current_caller()
        if target == ROOT:
            why = "needs cluster admin"
        elif rule.on is On.PARENT:
            why = f"needs admin on {target}"
        elif rule.owner_needs is not None:
            why = f"needs {rule.permission}, or {rule.owner_needs} as the job's owner"
        else:
            why = f"needs {needs}"
        action = rule.action.format(pool=pool, job=job)
        if self._metrics is not None:
            self._metrics.denied.labels(str(needs)).inc()
        log.info(
            "permission denied",
            extra={"caller": str(caller), "method": method, "pool": target, "needs": str(needs)},
        )
        raise PermissionDenied(f"{caller} may not {action} ({why})")

    def may(self, method: str, *, pool: str = "", owner: str = "") -> bool:
        """Whether :meth:`check` would let the caller call ``method`` on ``pool``, without
        counting or logging a refusal: what a page offers its caller (a button it greys out is
        no refused call)."""
        return self._denied(method, pool, owner) is None

    def _denied(self, method: str, pool: str, owner: str) -> tuple[str, Permission] | None:
        """None if the caller may call ``method`` on ``pool``; else the pool whose permission
        it lacks, and the permission it needs there."""
        rule = RULES[method]
        caller = current_caller()
        if caller.anonymous or rule.on is On.ANYONE:
            return None
        assert rule.permission is not None, method
        target = _target(rule.on, pool)
        needs = rule.permission
        if rule.owner_needs is not None and owner and owner == caller.name:
            needs = rule.owner_needs
        _, grants = self._grants()
        if allows(caller, needs, target, grants, self._admins):
            return None
        return target, needs

    def check_job(self, method: str, job: JobRecord) -> None:
        """:meth:`check` for an RPC on ``job``."""
        self.check(method, pool=job.spec.pool, job=job.id, owner=job.owner)

    def check_job_id(self, method: str, job_id: str, read: Callable[[str], JobRecord]) -> None:
        """:meth:`check` for an RPC on the job ``read`` gives for ``job_id``, read only when the
        caller's permissions are asked: not on a daemon without authentication."""
        if not current_caller().anonymous:
            self.check_job(method, read(job_id))

    def viewable_pools(self) -> frozenset[str] | None:
        """The pools whose jobs the caller may view; None: all of them."""
        tree, grants = self._grants()
        return viewable(current_caller(), tree.paths(), grants, self._admins)


def _target(on: On, pool: str) -> str:
    """The pool whose permission an RPC needs."""
    if on is On.CLUSTER:
        return ROOT
    if on is On.PARENT:
        return lineage(pool)[1] if pool != ROOT else ROOT
    return pool
