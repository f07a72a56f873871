"""Task discovery's topology: local and cross ranks of a gang's tasks from their hosts."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from peloton.core.gangenv import Rank, topology


def test_two_hosts_of_two() -> None:
    assert topology(["a", "a", "b", "b"]) == [
        Rank(0, 2, 0, 2),
        Rank(1, 2, 0, 2),
        Rank(0, 2, 1, 2),
        Rank(1, 2, 1, 2),
    ]


def test_uneven_hosts_form_smaller_cross_groups() -> None:
    # Host a holds 3 ranks, b one: local rank 0 exists on both hosts, 1 and 2 only on a.
    assert topology(["a", "a", "a", "b"]) == [
        Rank(0, 3, 0, 2),
        Rank(1, 3, 0, 1),
        Rank(2, 3, 0, 1),
        Rank(0, 1, 1, 2),
    ]


# Hosts by rank as placement gives them: each host's ranks contiguous.
layouts = st.lists(st.integers(1, 5), min_size=1, max_size=8).map(
    lambda sizes: [f"h{i}" for i, n in enumerate(sizes) for _ in range(n)]
)


@given(hosts=layouts)
def test_ranks_are_consistent(hosts: list[str]) -> None:
    ranks = topology(hosts)
    per_host = Counter(hosts)
    for host, r in zip(hosts, ranks, strict=True):
        assert r.local_size == per_host[host]
        assert 0 <= r.local_rank < r.local_size
        assert 0 <= r.cross_rank < r.cross_size
        # The cross group of local rank k: the hosts that hold more than k ranks.
        assert r.cross_size == sum(1 for n in per_host.values() if n > r.local_rank)
    # Every rank is one (local rank, cross rank) pair, and each host numbers its ranks 0..k-1.
    assert len({(r.local_rank, r.cross_rank) for r in ranks}) == len(hosts)
    for host in per_host:
        local = [r.local_rank for h, r in zip(hosts, ranks, strict=True) if h == host]
        assert local == list(range(per_host[host]))
