"""The offer pool: parsing real offer shapes, leases (never double-booked), rescinds, expiry."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.core.offers import Lease, LeaseError, Offer, take_ports
from peloton.core.resources import Resources
from peloton.hostmgr.offers import OfferPool, parse_offer


def raw_offer(
    offer_id: str, agent: str = "a1", hostname: str = "h1", cpus: float = 8, gpus: float = 4
) -> dict[str, Any]:
    """An offer as a Mesos 1.x master sends it (v1 JSON)."""
    return {
        "id": {"value": offer_id},
        "framework_id": {"value": "fw"},
        "agent_id": {"value": agent},
        "hostname": hostname,
        "url": {
            "scheme": "http",
            "address": {"hostname": hostname, "ip": "127.0.0.1", "port": 5051},
            "path": "/slave(1)",
        },
        "resources": [
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}, "role": "*"},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": 32768.0}, "role": "*"},
            {"name": "disk", "type": "SCALAR", "scalar": {"value": 100000.0}, "role": "*"},
            {"name": "gpus", "type": "SCALAR", "scalar": {"value": gpus}, "role": "*"},
            {
                "name": "ports",
                "type": "RANGES",
                "ranges": {"range": [{"begin": 31000, "end": 31004}]},
                "role": "*",
            },
        ],
        "attributes": [
            {"name": "rack", "type": "TEXT", "text": {"value": "r1"}},
            {"name": "gpu_model", "type": "TEXT", "text": {"value": "A100"}},
            {"name": "slots", "type": "SCALAR", "scalar": {"value": 2.0}},
        ],
        "allocation_info": {"role": "*"},
    }


def offer(offer_id: str, hostname: str = "h1", cpus: float = 8, at: float = 0.0) -> Offer:
    return parse_offer(raw_offer(offer_id, f"agent-{hostname}", hostname, cpus), at)


def test_parse_offer_reads_resources_ports_attributes_and_agent_address() -> None:
    o = parse_offer(raw_offer("o1"), 5.0)
    assert o.resources == Resources(cpu=8, mem_mb=32768, disk_mb=100000, gpu=4)
    assert o.ports == ((31000, 31004),)
    assert o.attributes == {"rack": "r1", "gpu_model": "A100", "slots": "2"}
    assert (o.agent_id, o.hostname, o.agent_address) == ("a1", "h1", "127.0.0.1:5051")
    # The entries as offered, with the offer's allocation_info (needed to launch on them).
    assert [r["name"] for r in o.entries] == ["cpus", "mem", "disk", "gpus", "ports"]
    assert all(r["allocation_info"] == {"role": "*"} for r in o.entries)
    assert o.received_at == 5.0


def test_parse_offer_names_the_missing_field() -> None:
    raw = raw_offer("o1")
    del raw["agent_id"]
    with pytest.raises(ValueError, match="agent_id"):
        parse_offer(raw, 0)


def test_take_ports_lowest_first_and_refuses_too_many() -> None:
    assert take_ports([(10, 11), (20, 22)], 4) == [10, 11, 20, 21]
    with pytest.raises(ValueError, match="needs 6 ports"):
        take_ports([(10, 11), (20, 22)], 6)


def test_a_leased_host_leaves_snapshots_and_cannot_be_leased_twice() -> None:
    pool = OfferPool(lease_seconds=10)
    pool.add([offer("o1", "h1"), offer("o2", "h1"), offer("o3", "h2")])
    assert [h.hostname for h in pool.snapshot()] == ["h1", "h2"]
    assert pool.snapshot()[0].free.cpu == 16
    lease = pool.lease("agent-h1", now=0)
    assert lease is not None and set(lease.offer_ids) == {"o1", "o2"}
    assert pool.lease("agent-h1", now=0) is None
    assert [h.hostname for h in pool.snapshot()] == ["h2"]
    pool.release(lease)
    assert [h.hostname for h in pool.snapshot()] == ["h1", "h2"]


def test_launch_consumes_all_leases_or_none() -> None:
    pool = OfferPool(lease_seconds=10)
    pool.add([offer("o1", "h1"), offer("o2", "h2")])
    a, b = pool.lease("agent-h1", 0), pool.lease("agent-h2", 0)
    assert a is not None and b is not None
    pool.rescind("o2")
    with pytest.raises(LeaseError, match=r"h2 \(agent-h2\) lost an offer"):
        pool.take_for_launch([a, b], now=1)
    assert pool.held() == 1  # o1 is still there, still leased
    pool.take_for_launch([a], now=1)
    assert pool.held() == 0
    with pytest.raises(LeaseError, match="released or has expired"):
        pool.take_for_launch([a], now=1)


def test_leases_expire_and_free_their_host() -> None:
    pool = OfferPool(lease_seconds=10)
    pool.add([offer("o1")])
    lease = pool.lease("agent-h1", now=0)
    assert lease is not None
    assert pool.expire(now=9.9) == []
    with pytest.raises(LeaseError, match="expired"):
        pool.take_for_launch([lease], now=10)
    assert pool.expire(now=10) == [lease]
    assert pool.lease("agent-h1", now=11) is not None


def test_stale_offers_are_taken_for_decline_but_leased_ones_stay() -> None:
    pool = OfferPool()
    pool.add([offer("o1", "h1", at=0), offer("o2", "h2", at=0), offer("o3", "h3", at=50)])
    assert pool.lease("agent-h2", now=1) is not None
    stale = pool.take_unleased(older_than=30, now=60)
    assert [o.offer_id for o in stale] == ["o1"]
    assert pool.held() == 2


def test_a_lost_agent_spoils_its_lease() -> None:
    pool = OfferPool()
    pool.add([offer("o1", "h1")])
    lease = pool.lease("agent-h1", 0)
    assert lease is not None
    assert pool.remove_agent("agent-h1") == ["o1"]
    with pytest.raises(LeaseError):
        pool.take_for_launch([lease], 1)


# ---------------------------------------------------------------- property: no double booking

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 3)),
        st.tuples(st.just("lease"), st.integers(0, 3)),
        st.tuples(st.just("release"), st.integers(0, 5)),
        st.tuples(st.just("launch"), st.integers(0, 5)),
        st.tuples(st.just("rescind"), st.integers(0, 30)),
        st.tuples(st.just("expire"), st.integers(0, 3)),
        st.tuples(st.just("lose"), st.integers(0, 3)),
        st.tuples(st.just("decline"), st.integers(0, 10)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_no_offer_is_ever_launched_twice_leased_twice_or_dropped(
    steps: list[tuple[str, int]],
) -> None:
    pool = OfferPool(lease_seconds=5)
    now = 0.0
    next_id = 0
    leases: list[Lease] = []
    launched: set[str] = set()
    # Where every offer went: each one the pool is given is held, launched, taken to be
    # declined, rescinded or lost with its agent -- never silently dropped (an offer nobody
    # declines stays outstanding at the master, its resources locked away).
    added: set[str] = set()
    gone: set[str] = set()
    for op, arg in steps:
        now += 1
        # Four agents on two hostnames: agents that share a hostname are distinct hosts.
        agent, hostname = f"agent-{arg % 4}", f"h{arg % 2}"
        if op == "add":
            pool.add([parse_offer(raw_offer(f"o{next_id}", agent, hostname), now)])
            added.add(f"o{next_id}")
            next_id += 1
        elif op == "lease":
            got = pool.lease(agent, now)
            if got is not None:
                assert got.agent_id == agent and got.hostname == hostname
                leases.append(got)
        elif op == "release" and leases:
            pool.release(leases[arg % len(leases)])
        elif op == "launch" and leases:
            lease = leases[arg % len(leases)]
            try:
                pool.take_for_launch([lease], now)
            except LeaseError:
                continue
            assert not launched & set(lease.offer_ids), "an offer was launched twice"
            launched |= set(lease.offer_ids)
        elif op == "rescind":
            if pool.rescind(f"o{arg}"):
                gone.add(f"o{arg}")
        elif op == "expire":
            now += arg * 3
            pool.expire(now)
        elif op == "lose":
            gone |= set(pool.remove_agent(agent))
        elif op == "decline":
            gone |= {o.offer_id for o in pool.take_unleased(older_than=arg, now=now)}
        # Invariants: snapshots never show leased hosts or launched offers; one live lease per
        # host at most.
        leased = pool.leased_hosts()
        assert not leased & {h.agent_id for h in pool.snapshot()}
        assert len({h.agent_id for h in pool.snapshot()}) == len(pool.snapshot())
    gone |= {o.offer_id for o in pool.take_unleased()}
    for lease in leases:
        pool.release(lease)
    gone |= {o.offer_id for o in pool.take_unleased()}
    assert pool.held() == 0
    assert added == launched | gone


def test_agents_that_share_a_hostname_are_hosts_of_their_own() -> None:
    pool = OfferPool()
    pool.add(
        [
            parse_offer(raw_offer("o1", "a1", "node-a"), 0),
            parse_offer(raw_offer("o2", "a2", "node-a"), 0),
        ]
    )
    snap = pool.snapshot()
    assert [(h.hostname, h.agent_id, h.free.gpu) for h in snap] == [
        ("node-a", "a1", 4),
        ("node-a", "a2", 4),
    ]
    first, second = pool.lease("a1", 0), pool.lease("a2", 0)
    assert first is not None and second is not None
    assert (first.offer_ids, second.offer_ids) == (("o1",), ("o2",))
    assert pool.held() == 2
