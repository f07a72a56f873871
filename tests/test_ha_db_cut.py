"""The leader's connection to PostgreSQL cut (every connection reset, new ones refused, through
a proxy the test controls) while the other daemon still reaches the database: the leader steps
down on its own clock and exits 75 (it never hangs on the dead database), the other takes over
within the time to live and a few seconds, the gangs submitted before and after run to their
end, and nothing is launched twice. Restored, the old leader starts again as a follower."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from daemon import DaemonProcess, start_minicluster, wait_for
from db_proxy import StallingProxy
from sqlalchemy.engine import make_url
from tcp_proxy import TcpProxy
from test_several_daemons import (
    AGENT,
    SCHEDULES,
    START_SECONDS,
    TAKEOVER_SECONDS,
    TTL,
    assert_launched_once,
    close_all,
    cluster_status,
    leader_gauge,
    some_running,
    start,
    submit_burst,
    wait_all_done,
    wait_leader,
)

from peloton.client import PelotonClient
from peloton.minicluster import AgentSpec, Minicluster
from peloton.server import DEPOSED_EXIT

on_postgresql = pytest.mark.parametrize("backend", ["postgresql"])
# The leader stops leading a fifth of the TTL before its lease can expire, and exits then; the
# rest is for a busy machine. It must never wait on the dead database longer.
STEP_DOWN_SECONDS = TTL + 5


@dataclass(frozen=True)
class Outage:
    """A proxy in front of the database and how the test breaks and mends the way through it."""

    how: str
    port: int
    begin: Callable[[], None]
    end: Callable[[], None]
    refused: Callable[[], int]  # connections refused while it lasted (reset only)


@pytest.fixture(params=["reset", "silence"])
def outage(request: pytest.FixtureRequest, db_url: str) -> Iterator[Outage]:
    """``reset``: every connection reset and new ones refused (tests/tcp_proxy.py); ``silence``:
    nothing forwarded any more, nothing closed, as a partition without a reset (db_proxy.py)."""
    url = make_url(db_url)
    host, port = url.host or "127.0.0.1", url.port or 5432
    if request.param == "reset":
        with TcpProxy(host, port) as cutter:
            yield Outage("reset", cutter.port, cutter.cut, cutter.restore, lambda: cutter.refused)
    else:
        with StallingProxy(host, port) as staller:
            yield Outage("silence", staller.port, staller.silence, staller.resume, lambda: 0)


def through(db_url: str, outage: Outage) -> str:
    """``db_url`` with the proxy's address in place of the database's."""
    url = make_url(db_url).set(host="127.0.0.1", port=outage.port)
    return url.render_as_string(hide_password=False)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    """Two agents with 2 GPUs each."""
    mc = start_minicluster([AgentSpec(f"agent-{i}", resources=AGENT) for i in range(2)], tmp_path)
    yield mc
    mc.stop()


def mesos_args(cluster: Minicluster) -> list[str]:
    return [
        "--mesos-master",
        cluster.address,
        "--reconcile-interval-seconds",
        "5",
        "--offer-refuse-seconds",
        "1",
    ]


@on_postgresql
def test_a_leader_cut_off_from_the_database_steps_down_and_the_other_takes_over(
    db_url: str, tmp_path: Path, cluster: Minicluster, outage: Outage
) -> None:
    procs: dict[str, DaemonProcess] = {}
    try:
        # a reaches the database through the proxy only; b directly.
        a = procs["a"] = start(through(db_url, outage), tmp_path, "a", mesos_args(cluster))
        a.wait_ready()
        wait_for(
            lambda: SCHEDULES in a.stderr, START_SECONDS, "a to schedule", state=lambda: a.stderr
        )
        b = procs["b"] = start(db_url, tmp_path, "b", mesos_args(cluster)).wait_ready()
        assert wait_leader(db_url, procs, TAKEOVER_SECONDS) == "a"
        with (
            PelotonClient(a.address, timeout=10) as on_a,
            PelotonClient(b.address, timeout=10) as on_b,
        ):
            before = submit_burst([on_a, on_b], 6)
            wait_for(
                lambda: some_running(cluster), START_SECONDS, "a gang running", state=cluster.tasks
            )

            cut_at = datetime.now(UTC)
            outage.begin()
            # a: every query fails now. Its term runs out on its own clock; it says so and exits.
            assert a.wait_exit(STEP_DOWN_SECONDS) == DEPOSED_EXIT, a.stderr
            exited_after = (datetime.now(UTC) - cut_at).total_seconds()
            assert "no longer the leader" in a.stderr
            assert "lost the leader lease" in a.stderr.splitlines()[-1], a.stderr
            if outage.how == "reset":  # it tried the database again meanwhile, and was refused
                assert outage.refused() > 0

            # Polled with room for a busy machine; when b took the lease is read below, on the
            # database's clock (this machine's), which the polling's cost does not change.
            assert wait_leader(db_url, {"b": b}, START_SECONDS) == "b"
            lease = cluster_status(db_url)["lease"]
            took_over_after = (
                datetime.fromisoformat(lease["acquired_at"]) - cut_at
            ).total_seconds()
            assert 0 < took_over_after <= TAKEOVER_SECONDS, (exited_after, lease)

            after = submit_burst([on_b], 4)
            wait_all_done(on_b, before + after)
        assert_launched_once(cluster)

        # Back on the network (as its supervisor would start it): a follows, b leads on.
        outage.end()
        procs["a"] = start(through(db_url, outage), tmp_path / "again", "a", mesos_args(cluster))
        again = procs["a"].wait_ready()
        wait_for(
            lambda: (
                "this daemon is the leader" not in again.stderr
                and leader_gauge(again) == 0
                and leader_gauge(b) == 1
            ),
            TAKEOVER_SECONDS,
            "a back as a follower, b the leader",
            state=lambda: (leader_gauge(again), leader_gauge(b), again.stderr[-2000:]),
        )
        assert wait_leader(db_url, procs, TAKEOVER_SECONDS) == "b"
    finally:
        close_all(procs)
