"""The leader lease's decision rules (peloton.core.term): when a daemon leads, when it asks again,
and that two daemons never both believe they lead, whatever the delays, pauses and clock rates."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.core.term import LeaseTiming, Term

TIMING = LeaseTiming(ttl=10.0, renew_every=3.0)  # margin 2


def test_a_term_counts_from_when_the_request_was_sent_less_the_margin() -> None:
    term = Term(TIMING)
    assert not term.leads(0.0)
    # Sent at 10, answered at 14: the term ends at 10 + 10 - 2, whenever the answer came.
    term.granted(sent=10.0, epoch=1)
    assert term.leads(14.0) and term.leads(17.999)
    assert not term.leads(18.0)
    assert term.epoch == 1


def test_a_refusal_ends_the_term_at_once() -> None:
    term = Term(TIMING)
    term.granted(sent=0.0, epoch=4)
    term.refused()
    assert not term.leads(0.1)
    assert term.epoch is None


def test_a_leader_renews_every_interval_and_wakes_at_the_end_of_its_term() -> None:
    term = Term(TIMING)
    assert term.renewal_due(now=5.0, last_sent=0.0) == 5.0  # overdue: at once
    assert term.renewal_due(now=1.0, last_sent=0.0) == 3.0
    term.granted(sent=0.0, epoch=1)  # leads until 8
    assert term.wake_at(now=1.0, last_sent=0.0) == 3.0
    # A request sent at 7 that has not come back: wake at 8 to stop leading, not at 10.
    assert term.wake_at(now=7.5, last_sent=7.0) == 8.0
    follower = Term(TIMING)
    assert follower.wake_at(now=1.0, last_sent=0.0) == 3.0


@pytest.mark.parametrize(("ttl", "renew"), [(10.0, 8.0), (10.0, 0.0), (1.0, 2.0)])
def test_a_renewal_interval_that_does_not_fit_the_term_is_refused(ttl: float, renew: float) -> None:
    with pytest.raises(ValueError, match="renewed more often"):
        LeaseTiming(ttl, renew)


# ---------------------------------------------------------------------------- the property


@dataclass
class Lease:
    """The database's lease row on the database's clock (the true time here), with the rules of
    peloton.storage.leases (tests/test_leader_lease.py checks the SQL keeps them)."""

    holder: int | None = None
    epoch: int = 0
    expires: float = float("-inf")

    def ask(self, daemon: int, epoch: int | None, now: float, ttl: float) -> int | None:
        if epoch is None:
            if self.holder is not None and self.expires >= now:
                return None
            self.holder, self.epoch = daemon, self.epoch + 1
        elif not (self.holder == daemon and self.epoch == epoch and self.expires >= now):
            return None
        self.expires = now + ttl
        return self.epoch


@dataclass
class Daemon:
    """A daemon with its own clock (offset and rate against the true time) and its belief."""

    offset: float
    rate: float
    # Per request: (in flight to the database, back to the daemon, pause before the next),
    # seconds of true time; a long one is a pause (SIGSTOP, GC) or a stalled network.
    requests: list[tuple[float, float, float]]
    fails: list[bool]
    term: Term = field(default_factory=lambda: Term(TIMING))
    # The true-time intervals in which it believed it led.
    believed: list[list[float]] = field(default_factory=list)

    def local(self, true: float) -> float:
        return self.offset + self.rate * true

    def true(self, local: float) -> float:
        return (local - self.offset) / self.rate


def simulate(daemons: list[Daemon]) -> Lease:
    """Run every daemon's requests against one lease, in true-time order."""
    lease = Lease()
    # (true time, sequence, kind, daemon, request index, sent at (local), epoch asked or held)
    events: list[tuple[float, int, str, int, int, float, int | None]] = []
    seq = 0

    def push(t: float, kind: str, d: int, k: int, sent: float, epoch: int | None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, d, k, sent, epoch))

    for d in range(len(daemons)):
        push(0.0, "send", d, 0, 0.0, None)
    while events:
        t, _, kind, d, k, sent, epoch = heapq.heappop(events)
        daemon = daemons[d]
        if kind == "send":
            if k == len(daemon.requests):
                continue
            local = daemon.local(t)
            asked = daemon.term.epoch if daemon.term.leads(local) else None
            push(t + daemon.requests[k][0], "execute", d, k, local, asked)
        elif kind == "execute":
            held = None if daemon.fails[k] else lease.ask(d, epoch, t, TIMING.ttl)
            push(t + daemon.requests[k][1], "answer", d, k, sent, held)
        else:
            answer(daemon, t, sent, epoch, failed=daemon.fails[k])
            push(t + daemon.requests[k][2], "send", d, k + 1, 0.0, None)
    return lease


def answer(daemon: Daemon, t: float, sent: float, held: int | None, *, failed: bool) -> None:
    """The daemon reads the answer at true time ``t``; note how its belief changed."""
    led = daemon.term.leads(daemon.local(t))
    if failed:
        return  # a request that failed changes nothing: the term runs out on its own
    if held is None:
        daemon.term.refused()
        if led:
            daemon.believed[-1][1] = t
        return
    daemon.term.granted(sent, held)
    until = daemon.true(daemon.term.until)
    if led:
        daemon.believed[-1][1] = until
    elif until > t:
        daemon.believed.append([t, until])


seconds = st.floats(min_value=0.0, max_value=30.0, allow_nan=False)


@st.composite
def daemons(draw: st.DrawFn) -> list[Daemon]:
    count = draw(st.integers(min_value=2, max_value=3))
    made = []
    for _ in range(count):
        n = draw(st.integers(min_value=1, max_value=12))
        made.append(
            Daemon(
                offset=draw(st.floats(min_value=-1e6, max_value=1e6)),
                # Clock rates within 10% of the database's (the margin allows 20%).
                rate=draw(st.floats(min_value=0.9, max_value=1.1)),
                requests=draw(
                    st.lists(st.tuples(seconds, seconds, seconds), min_size=n, max_size=n)
                ),
                fails=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
            )
        )
    return made


@settings(max_examples=500, deadline=None)
@given(daemons())
def test_two_daemons_never_both_believe_they_lead_at_once(ds: list[Daemon]) -> None:
    simulate(ds)
    for i, a in enumerate(ds):
        for b in ds[i + 1 :]:
            for start, end in a.believed:
                for other_start, other_end in b.believed:
                    assert not (start < other_end and other_start < end), (a.believed, b.believed)


def test_the_simulation_elects_a_leader_when_nothing_is_late() -> None:
    # Not vacuous: with prompt answers the first daemon leads, the second waits.
    quick = [(0.01, 0.01, TIMING.renew_every)] * 5
    ds = [Daemon(0.0, 1.0, list(quick), [False] * 5), Daemon(5.0, 1.05, list(quick), [False] * 5)]
    lease = simulate(ds)
    assert lease.holder == 0 and lease.epoch == 1
    assert len(ds[0].believed) == 1 and not ds[1].believed
