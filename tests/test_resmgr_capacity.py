"""Capacity judged over what the cluster has had recently: hosts lost less than the grace period
ago still count toward "can never fit"; a gang that needs them waits, naming them."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from peloton.core.capacity import Lost, LostHost, lost_total, recently_lost
from peloton.core.resources import Resources
from peloton.hostmgr.hosts import HostRegistry
from peloton.resmgr import admission
from peloton.resmgr.admission import Room, Waiting, admit
from peloton.storage.db import Database
from peloton.storage.hosts import SqlHostStore

T0 = datetime(2026, 11, 25, 23, 50, 5, tzinfo=UTC)
HOST = Resources(cpu=8, mem_mb=1024, gpu=2)
GRACE = 300.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_host_counts_for_the_grace_period_after_it_was_lost() -> None:
    lost = [Lost("gpu-r2-1", HOST, T0)]
    counted = recently_lost(lost, ["gpu-r1-1"], at(5), GRACE)
    assert counted == (LostHost("gpu-r2-1", HOST, T0, at(GRACE)),)
    assert lost_total(counted) == HOST
    assert recently_lost(lost, ["gpu-r1-1"], at(GRACE - 0.001), GRACE) == counted
    assert recently_lost(lost, ["gpu-r1-1"], at(GRACE), GRACE) == ()
    # A zero grace counts no lost host: the old behaviour.
    assert recently_lost(lost, [], T0, 0) == ()


def test_a_host_back_under_a_new_agent_counts_once_and_the_newest_loss_wins() -> None:
    assert recently_lost([Lost("h", HOST, T0)], ["h"], at(1), GRACE) == ()
    twice = [Lost("h", HOST, at(10)), Lost("h", HOST, T0), Lost("a", HOST, T0)]
    assert [(h.hostname, h.lost_at) for h in recently_lost(twice, [], at(20), GRACE)] == [
        ("a", T0),
        ("h", at(10)),
    ]


def _room() -> Room:
    unlimited = Resources(cpu=math.inf, mem_mb=math.inf, disk_mb=math.inf, gpu=math.inf)
    return Room("/", unlimited, Resources(), unlimited, Resources(), unlimited)


def _gang(key: str, gpu: float) -> Waiting:
    return Waiting(key, 0, True, 0.0, 0, 2, Resources(cpu=2, gpu=gpu))


def test_a_gang_that_fits_only_with_the_lost_hosts_waits_naming_them() -> None:
    now = HOST
    lost = (LostHost("gpu-r2-1", HOST, T0, at(GRACE)),)
    d = admit([_gang("big", 4), _gang("small", 2)], _room(), now, now, lost=lost)
    assert d.pending["big"] == (
        admission.PENDING_CLUSTER,
        "cluster: gang needs 4 gpu, 2 available now; 2 more on gpu-r2-1 (lost at "
        "2026-11-25 23:50:05 UTC, counted until 2026-11-25 23:55:05 UTC)",
    )
    assert not d.infeasible
    # The waiting gang holds nothing: what fits the hosts there now still runs.
    assert [g.key for g in d.admitted] == ["small"]


def test_a_gang_too_big_even_with_the_lost_hosts_is_infeasible() -> None:
    lost = (LostHost("gpu-r2-1", HOST, T0, at(GRACE)),)
    d = admit([_gang("huge", 6)], _room(), HOST, HOST, lost=lost)
    assert d.infeasible["huge"] == (
        admission.INFEASIBLE,
        "cluster: gang needs 6 gpu, capacity is 4; the gang can never fit",
    )
    # Without lost hosts (the grace over), the capacity there now decides.
    d = admit([_gang("big", 4)], _room(), HOST, HOST)
    assert d.infeasible["big"][1] == (
        "cluster: gang needs 4 gpu, capacity is 2; the gang can never fit"
    )


def test_many_lost_hosts_are_named_up_to_three() -> None:
    lost = tuple(LostHost(f"h{i}", HOST, T0, at(GRACE)) for i in range(5))
    d = admit([_gang("big", 12)], _room(), HOST, HOST, lost=lost)
    message = d.pending["big"][1]
    assert message.startswith("cluster: gang needs 12 gpu, 2 available now; 2 more on h0 (")
    assert message.count(" more on ") == 3 and message.endswith(", 2 more lost hosts")


def test_the_registry_counts_a_lost_agent_until_its_grace_ends_or_it_is_back(
    db: Database,
) -> None:
    clock = [T0]
    registry = HostRegistry(SqlHostStore(db), lambda: clock[0])
    for name in ("h1", "h2"):
        record = registry.observe(name, f"a-{name}", HOST, {}, f"{name}:5051")
        assert record is not None
        registry.save([record])
    assert registry.recently_lost(GRACE) == ()
    registry.agent_lost("a-h2")
    clock[0] = at(5)
    assert registry.total() == HOST
    assert registry.recently_lost(GRACE) == (LostHost("h2", HOST, T0, at(GRACE)),)
    clock[0] = at(GRACE)
    assert registry.recently_lost(GRACE) == ()
    # Back under a new agent id and another address (a minicluster's agent restarted).
    clock[0] = at(10)
    assert registry.recently_lost(GRACE) != ()
    registry.observe("h2", "a-h2-again", HOST, {}, "10.0.0.2:5051")
    assert registry.recently_lost(GRACE) == ()
    assert registry.total() == HOST.scale(2)
