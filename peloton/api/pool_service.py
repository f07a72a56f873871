"""PoolService: the public pool API (proto/peloton/v1/pool.proto)."""

from __future__ import annotations

import math

import grpc

from peloton.api.authz import Authorizer, method_name
from peloton.core.access import GROUP, USER, Grant, Permission, Principal
from peloton.core.pools import ROOT, KindConfig, Policy, PoolConfig, QueuePolicy
from peloton.errors import InvalidArgument
from peloton.resmgr.manager import ResourceManager
from peloton.resmgr.metrics import PoolStatus
from peloton.resmgr.pool import PoolTree
from peloton.v1 import pool_pb2, pool_pb2_grpc

_POLICY = {
    pool_pb2.RESOURCE_POLICY_UNSPECIFIED: Policy.ELASTIC,
    pool_pb2.RESOURCE_POLICY_ELASTIC: Policy.ELASTIC,
    pool_pb2.RESOURCE_POLICY_STATIC: Policy.STATIC,
}
_POLICY_PB = {
    Policy.ELASTIC: pool_pb2.RESOURCE_POLICY_ELASTIC,
    Policy.STATIC: pool_pb2.RESOURCE_POLICY_STATIC,
}
_QUEUE = {
    pool_pb2.QUEUE_POLICY_UNSPECIFIED: QueuePolicy.PRIORITY_FIFO,
    pool_pb2.QUEUE_POLICY_PRIORITY_FIFO: QueuePolicy.PRIORITY_FIFO,
    pool_pb2.QUEUE_POLICY_FIFO: QueuePolicy.FIFO,
    pool_pb2.QUEUE_POLICY_BACKFILL: QueuePolicy.BACKFILL,
    pool_pb2.QUEUE_POLICY_LAS: QueuePolicy.LAS,
}
_PERMISSION = {
    pool_pb2.PERMISSION_VIEW: Permission.VIEW,
    pool_pb2.PERMISSION_SUBMIT: Permission.SUBMIT,
    pool_pb2.PERMISSION_ADMIN: Permission.ADMIN,
}
_PERMISSION_PB = {p: pb for pb, p in _PERMISSION.items()}

CREATE_POOL = method_name("PoolService", "CreatePool")
UPDATE_POOL = method_name("PoolService", "UpdatePool")
DELETE_POOL = method_name("PoolService", "DeletePool")
GET_POOL = method_name("PoolService", "GetPool")
LIST_POOLS = method_name("PoolService", "ListPools")

_QUEUE_PB = {
    QueuePolicy.PRIORITY_FIFO: pool_pb2.QUEUE_POLICY_PRIORITY_FIFO,
    QueuePolicy.FIFO: pool_pb2.QUEUE_POLICY_FIFO,
    QueuePolicy.BACKFILL: pool_pb2.QUEUE_POLICY_BACKFILL,
    QueuePolicy.LAS: pool_pb2.QUEUE_POLICY_LAS,
}


def config_from_pb(spec: pool_pb2.PoolSpec) -> PoolConfig:
    """A pool config from its proto; field checks happen in the pool tree."""
    kinds = {}
    for kind, rc in spec.resources.items():
        if rc.policy not in _POLICY:
            raise InvalidArgument(f"resources.{kind}.policy", f"unknown policy {rc.policy}")
        kinds[kind] = KindConfig(
            reservation=rc.reservation,
            limit=rc.limit if rc.HasField("limit") else math.inf,
            share=rc.share if rc.HasField("share") else 1.0,
            policy=_POLICY[rc.policy],
        )
    if spec.queue_policy not in _QUEUE:
        raise InvalidArgument("queue_policy", f"unknown queue policy {spec.queue_policy}")
    return PoolConfig(
        path=spec.path,
        owner=spec.owner,
        kinds=kinds,
        queue_policy=_QUEUE[spec.queue_policy],
        grants=tuple(grant_from_pb(g, f"grants[{i}]") for i, g in enumerate(spec.grants)),
    )


def grant_from_pb(grant: pool_pb2.Grant, field: str) -> Grant:
    """A grant from its proto: a known permission and exactly one of user and group (the names
    are checked with the pool's config)."""
    if grant.permission not in _PERMISSION:
        raise InvalidArgument(
            f"{field}.permission", f"unknown permission {grant.permission}; view, submit or admin"
        )
    if bool(grant.user) == bool(grant.group):
        raise InvalidArgument(field, "give exactly one of user and group")
    principal = Principal(USER, grant.user) if grant.user else Principal(GROUP, grant.group)
    return Grant(principal, _PERMISSION[grant.permission])


def grant_pb(grant: Grant) -> pool_pb2.Grant:
    who = {grant.principal.kind: grant.principal.name}
    return pool_pb2.Grant(permission=_PERMISSION_PB[grant.permission], **who)


def spec_pb(config: PoolConfig) -> pool_pb2.PoolSpec:
    spec = pool_pb2.PoolSpec(
        path=config.path, owner=config.owner, queue_policy=_QUEUE_PB[config.queue_policy]
    )
    for kind, kc in sorted(config.kinds.items()):
        rc = spec.resources[kind]
        rc.reservation = kc.reservation
        if not math.isinf(kc.limit):
            rc.limit = kc.limit
        rc.share = kc.share
        rc.policy = _POLICY_PB[kc.policy]
    spec.grants.extend(grant_pb(g) for g in config.grants)
    return spec


def pool_pb(tree: PoolTree, status: PoolStatus) -> pool_pb2.Pool:
    path = status.path
    spec = pool_pb2.PoolSpec(path=ROOT) if path == ROOT else spec_pb(tree.get(path))
    pool = pool_pb2.Pool(
        spec=spec,
        children=sorted(tree.children(path)),
        queued_gangs=status.queued_gangs,
        oversized_gangs=status.oversized_gangs,
    )
    for kind, ks in status.kinds.items():
        rs = pool.status[kind]
        rs.reservation = ks.reservation
        if not math.isinf(ks.limit):
            rs.limit = ks.limit
        rs.share = ks.share
        rs.entitlement = ks.entitlement
        rs.allocation = ks.allocation
        rs.demand = ks.demand
        rs.borrowed = ks.borrowed
        rs.lent = ks.lent
    return pool


class PoolService(pool_pb2_grpc.PoolServiceServicer):
    def __init__(self, resmgr: ResourceManager, authz: Authorizer) -> None:
        self._resmgr = resmgr
        self._authz = authz

    def CreatePool(
        self, request: pool_pb2.CreatePoolRequest, context: grpc.ServicerContext
    ) -> pool_pb2.CreatePoolResponse:
        config = config_from_pb(_spec(request))
        self._authz.check(CREATE_POOL, pool=config.path)
        status = self._resmgr.create_pool(config)
        return pool_pb2.CreatePoolResponse(pool=pool_pb(self._resmgr.pool_tree(), status))

    def UpdatePool(
        self, request: pool_pb2.UpdatePoolRequest, context: grpc.ServicerContext
    ) -> pool_pb2.UpdatePoolResponse:
        config = config_from_pb(_spec(request))
        self._authz.check(UPDATE_POOL, pool=config.path)
        status = self._resmgr.update_pool(config)
        return pool_pb2.UpdatePoolResponse(pool=pool_pb(self._resmgr.pool_tree(), status))

    def DeletePool(
        self, request: pool_pb2.DeletePoolRequest, context: grpc.ServicerContext
    ) -> pool_pb2.DeletePoolResponse:
        self._authz.check(DELETE_POOL, pool=_path(request.path))
        self._resmgr.delete_pool(request.path)
        return pool_pb2.DeletePoolResponse()

    def GetPool(
        self, request: pool_pb2.GetPoolRequest, context: grpc.ServicerContext
    ) -> pool_pb2.GetPoolResponse:
        self._authz.check(GET_POOL, pool=request.path)
        status = self._resmgr.status(_path(request.path))
        return pool_pb2.GetPoolResponse(pool=pool_pb(self._resmgr.pool_tree(), status))

    def ListPools(
        self, request: pool_pb2.ListPoolsRequest, context: grpc.ServicerContext
    ) -> pool_pb2.ListPoolsResponse:
        self._authz.check(LIST_POOLS)
        tree = self._resmgr.pool_tree()
        statuses = self._resmgr.statuses()
        return pool_pb2.ListPoolsResponse(
            pools=[pool_pb(tree, statuses[p]) for p, _ in tree.walk() if p in statuses]
        )


def _spec(request: pool_pb2.CreatePoolRequest | pool_pb2.UpdatePoolRequest) -> pool_pb2.PoolSpec:
    if not request.HasField("spec"):
        raise InvalidArgument("spec", "is required")
    return request.spec


def _path(path: str) -> str:
    if not path:
        raise InvalidArgument("path", "is required")
    return path
