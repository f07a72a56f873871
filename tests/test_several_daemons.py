"""Several ``peloton server`` processes on one PostgreSQL database elect one leader by the lease:
exactly one leads; a killed leader is replaced within the lease's time to live; a paused one is
replaced under a higher epoch and, resumed, has already stopped leading on its own clock, and
exits. ``peloton cluster status`` shows it all.

With a minicluster: only the leader subscribes to Mesos and schedules, jobs sent to either daemon
run, and across a killed or paused leader every job ends, each attempt launched once."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from daemon import (
    DONE,
    ROOT,
    DaemonProcess,
    error_line,
    run_peloton,
    scrape_metrics,
    start_minicluster,
    wait_for,
)
from support import make_spec

from peloton.client import ClientError, PelotonClient
from peloton.core.records import parse_attempt_id
from peloton.minicluster import AgentSpec, Minicluster
from peloton.server import DEPOSED_EXIT
from peloton.v1 import job_pb2, pool_pb2

TTL = 3.0
RENEW = 0.5
# A follower takes over at most a renewal after the lease expired; the rest is for a busy machine.
TAKEOVER_SECONDS = TTL + RENEW + 5
on_postgresql = pytest.mark.parametrize("backend", ["postgresql"])
on_sqlite = pytest.mark.parametrize("backend", ["sqlite"])
START_SECONDS = 30


def start(db_url: str, workdir: Path, daemon_id: str, extra: Sequence[str] = ()) -> DaemonProcess:
    args = [
        "--db-url",
        db_url,
        "--data-dir",
        str(workdir / "data"),
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        "--daemon-id",
        daemon_id,
        "--leader-lease-ttl-seconds",
        str(TTL),
        "--leader-lease-renew-seconds",
        str(RENEW),
        "--log-format",
        "text",
        *extra,
    ]
    return DaemonProcess(workdir / daemon_id, args)


def close_all(procs: Mapping[str, DaemonProcess]) -> None:
    for proc in procs.values():
        if proc.proc.poll() is None:
            proc.proc.send_signal(signal.SIGCONT)  # a stopped process ignores SIGKILL's wait
        proc.close()


@pytest.fixture
def daemons(db_url: str, tmp_path: Path) -> Iterator[dict[str, DaemonProcess]]:
    procs: dict[str, DaemonProcess] = {}
    try:
        # One after the other: two daemons starting on a new database at the same instant both
        # create the /default pool, and one exits (README "Several daemons").
        for name in ("a", "b"):
            procs[name] = start(db_url, tmp_path, name)
            procs[name].wait_ready()
        yield procs
    finally:
        close_all(procs)


def leader_gauge(proc: DaemonProcess) -> float:
    return scrape_metrics(proc.metrics_port)[("peloton_leader", ())]


def cluster_status(db_url: str) -> dict[str, Any]:
    # The daemons' time to live, by which status judges their heartbeats.
    ttl = ["--leader-lease-ttl-seconds", str(TTL)]
    result = run_peloton("cluster", "status", "--db-url", db_url, *ttl, "-o", "json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def wait_leader(db_url: str, among: dict[str, DaemonProcess], timeout: float) -> str:
    """The one daemon of ``among`` that both the database and its own gauge say leads."""

    def one() -> str | None:
        leaders = [name for name, proc in among.items() if leader_gauge(proc) == 1]
        held = cluster_status(db_url)["leader"]
        return leaders[0] if leaders == [held] else None

    return wait_for(
        one,
        timeout,
        "exactly one leader",
        interval=0.1,
        state=lambda: (
            {name: leader_gauge(proc) for name, proc in among.items()},
            cluster_status(db_url),
        ),
    )


def replace_leader(
    db_url: str, daemons: dict[str, DaemonProcess], stop: Callable[[DaemonProcess], object]
) -> tuple[str, str]:
    """Stop the leader with ``stop``; the other takes over under the next epoch in time.
    Returns the old leader and the new."""
    leader = wait_leader(db_url, daemons, TAKEOVER_SECONDS)
    epoch = cluster_status(db_url)["lease"]["epoch"]
    stop(daemons[leader])
    rest = {name: proc for name, proc in daemons.items() if name != leader}
    successor = wait_leader(db_url, rest, TAKEOVER_SECONDS)
    status = cluster_status(db_url)
    assert status["lease"]["epoch"] == epoch + 1, status
    return leader, successor


@on_postgresql
def test_exactly_one_leads_and_status_shows_both(
    db_url: str, daemons: dict[str, DaemonProcess]
) -> None:
    leader = wait_leader(db_url, daemons, TAKEOVER_SECONDS)
    follower = "b" if leader == "a" else "a"
    assert leader_gauge(daemons[follower]) == 0
    status = cluster_status(db_url)
    assert status["lease"]["holder"] == leader and status["lease"]["epoch"] >= 1
    assert not status["lease"]["expired"]
    by_id = {d["daemon_id"]: d for d in status["daemons"]}
    assert set(by_id) == {"a", "b"}
    assert by_id[leader]["leader"] and not by_id[follower]["leader"]
    wait_for(
        lambda: all(d["healthy"] for d in cluster_status(db_url)["daemons"]),
        TAKEOVER_SECONDS,
        "both daemons healthy",
        state=lambda: cluster_status(db_url),
    )
    assert by_id["a"]["address"] == daemons["a"].address
    metrics = scrape_metrics(daemons[leader].metrics_port)
    assert metrics[("peloton_leader_changes_total", ())] >= 1
    assert metrics[("peloton_leader_lease_renew_seconds_count", ())] >= 1
    table = run_peloton("cluster", "status", "--db-url", db_url)
    assert table.returncode == 0, table.stderr
    assert f"leader:  {leader} (epoch " in table.stdout
    assert "follower" in table.stdout and "healthy" in table.stdout


@on_postgresql
def test_a_follower_refuses_pool_reads_in_one_line_and_the_leader_answers(
    db_url: str, daemons: dict[str, DaemonProcess]
) -> None:
    """Only the leader knows the pools' entitlements, allocations and demand (a follower runs
    no cycles): a follower refuses pool reads with FAILED_PRECONDITION naming where to ask (it
    failed INTERNAL, and listed no pool at all); the CLI prints one error line."""
    leader = wait_leader(db_url, daemons, TAKEOVER_SECONDS)
    follower = "b" if leader == "a" else "a"
    with (
        PelotonClient(daemons[leader].address, timeout=10) as at_leader,
        PelotonClient(daemons[follower].address, timeout=10) as at_follower,
    ):
        at_leader.create_pool(pool_pb2.PoolSpec(path="/made-later"))
        assert at_leader.get_pool("/made-later").spec.path == "/made-later"
        assert {p.spec.path for p in at_leader.list_pools()} >= {"/default", "/made-later"}
        for read in (lambda: at_follower.get_pool("/default"), at_follower.list_pools):
            with pytest.raises(ClientError) as refused:
                read()
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "this daemon does not lead: read pools through the leader" in str(refused.value)
    result = run_peloton("--server", daemons[follower].address, "pool", "list")
    assert result.returncode != 0
    assert error_line(result).startswith("error: ")
    assert "read pools through the leader" in error_line(result)


@on_postgresql
def test_a_killed_leader_is_replaced_within_the_time_to_live(
    db_url: str, daemons: dict[str, DaemonProcess]
) -> None:
    leader, successor = replace_leader(db_url, daemons, DaemonProcess.kill)
    status = cluster_status(db_url)
    assert {d["daemon_id"]: d["leader"] for d in status["daemons"]} == {
        leader: False,
        successor: True,
    }
    # The killed daemon stops heartbeating: status calls it silent once its time to live is up.
    wait_for(
        lambda: (
            not {d["daemon_id"]: d for d in cluster_status(db_url)["daemons"]}[leader]["healthy"]
        ),
        TAKEOVER_SECONDS,
        "the killed daemon to be silent",
        interval=0.2,
        state=lambda: cluster_status(db_url),
    )


@on_postgresql
def test_a_paused_leader_is_replaced_and_has_stepped_down_when_it_resumes(
    db_url: str, daemons: dict[str, DaemonProcess]
) -> None:
    leader, _ = replace_leader(db_url, daemons, lambda p: p.proc.send_signal(signal.SIGSTOP))
    paused = daemons[leader]
    paused.proc.send_signal(signal.SIGCONT)
    # Its term ended on its own clock while it was paused, before the lease could expire on the
    # database's: resumed, it says so and exits for its supervisor to start it as a follower.
    assert paused.wait_exit(TAKEOVER_SECONDS) == DEPOSED_EXIT
    assert "no longer the leader" in paused.stderr
    assert "lost the leader lease" in paused.stderr.splitlines()[-1]
    rest = {name: proc for name, proc in daemons.items() if name != leader}
    assert wait_leader(db_url, rest, TAKEOVER_SECONDS) != leader


@on_sqlite
def test_status_on_sqlite_says_it_is_one_daemon(db_url: str) -> None:
    result = run_peloton("cluster", "status", "--db-url", db_url)
    assert result.returncode == 1
    assert "need PostgreSQL" in error_line(result)


@on_sqlite
def test_a_daemon_id_on_sqlite_is_refused_in_one_line(db_url: str, tmp_path: Path) -> None:
    args = ["--db-url", db_url, "--grpc-port", "0", "--metrics-port", "0", "--daemon-id", "a"]
    with DaemonProcess(tmp_path / "d", args) as proc:
        assert proc.wait_exit(START_SECONDS) == 1
        assert "need PostgreSQL" in proc.stderr.splitlines()[-1]


# ---------------------------------------------------------------------------- README


README_DB = "postgresql://peloton@db/peloton"


def readme_block() -> str:
    section = (ROOT / "README.md").read_text().split("\n## Several daemons\n", 1)[1]
    return section.split("\n## ", 1)[0].split("\n```\n", 2)[1]


@on_postgresql
def test_the_readme_block_runs_as_written(db_url: str, tmp_path: Path) -> None:
    """The block's commands in order, on the test's database and on ports the kernel picks; the
    daemons it starts in the background (``&``) are waited for before the status."""
    text = readme_block().replace(README_DB, db_url)
    # Ports the kernel picks (the daemons tell them in their port files).
    text = re.sub(r"--(grpc|metrics)-port \d+", r"--\1-port 0", text)
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    started: list[DaemonProcess] = []
    try:
        for line in text.splitlines():
            words = shlex.split(line.removesuffix("&"))
            assert words[0] == "peloton", line
            if line.endswith("&"):
                assert words[1] == "server", line
                proc = DaemonProcess(tmp_path / f"d{len(started)}", words[2:], env=env)
                started.append(proc.wait_ready())
                continue
            result = wait_for(
                lambda words=words: ok_with_leader(run_peloton(*words[1:], env=env)),
                TAKEOVER_SECONDS,
                f"{line!r} to succeed (and to name a leader, if it is the status)",
            )
        assert re.match(r"leader:  [ab] \(epoch \d+, since ", result.stdout), result.stdout
    finally:
        for proc in started:
            proc.close()


def ok_with_leader(
    result: subprocess.CompletedProcess[str],
) -> subprocess.CompletedProcess[str] | None:
    assert result.returncode == 0, result.stderr
    return None if result.stdout.startswith("leader:  none") else result


def test_a_renewal_that_does_not_fit_the_time_to_live_is_a_usage_error() -> None:
    timing = ["--leader-lease-ttl-seconds", "1", "--leader-lease-renew-seconds", "1"]
    result = run_peloton("server", "--daemon-id", "a", *timing)
    assert result.returncode == 2
    assert error_line(result).startswith("error: invalid: leader_lease_renew_seconds: ")


# ---------------------------------------------------------------------------- scheduling

AGENT = "cpus:4;mem:8192;disk:10000;gpus:2;ports:[31000-31100]"
# The log line of a daemon whose scheduling components started (it leads).
SCHEDULES = "this daemon schedules now"
BURST = 12
BURST_SECONDS = 120


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    """Two agents with 2 GPUs each."""
    mc = start_minicluster([AgentSpec(f"agent-{i}", resources=AGENT) for i in range(2)], tmp_path)
    yield mc
    mc.stop()


@pytest.fixture
def scheduling(
    db_url: str, tmp_path: Path, cluster: Minicluster
) -> Iterator[dict[str, DaemonProcess]]:
    """Daemons a (the leader) and b on one database and one minicluster."""
    mesos = [
        "--mesos-master",
        cluster.address,
        "--reconcile-interval-seconds",
        "5",
        "--offer-refuse-seconds",
        "1",
    ]
    procs: dict[str, DaemonProcess] = {}
    try:
        a = procs["a"] = start(db_url, tmp_path, "a", mesos).wait_ready()
        # b starts once a schedules: a leads, and created the /default pool that b reads.
        wait_for(
            lambda: SCHEDULES in a.stderr, START_SECONDS, "a to schedule", state=lambda: a.stderr
        )
        procs["b"] = start(db_url, tmp_path, "b", mesos).wait_ready()
        yield procs
    finally:
        close_all(procs)


@pytest.fixture
def clients(scheduling: dict[str, DaemonProcess]) -> Iterator[dict[str, PelotonClient]]:
    made = {name: PelotonClient(proc.address, timeout=10) for name, proc in scheduling.items()}
    yield made
    for client in made.values():
        client.close()


def submit_burst(clients: Sequence[PelotonClient], count: int = BURST) -> list[str]:
    """``count`` gangs of two 1-GPU tasks, sent to the clients in turn."""
    spec = make_spec(2, name="burst", command="sleep 1", gpu=1)
    return [clients[i % len(clients)].create_job(spec).job_id for i in range(count)]


def wait_all_done(client: PelotonClient, job_ids: Sequence[str]) -> None:
    """Every job ended, and succeeded (the jobs' states shown on timeout)."""

    def states() -> dict[str, str]:
        return {j: job_pb2.JobState.Name(client.get_job(j).state) for j in job_ids}

    wait_for(
        lambda: all(client.get_job(j).state in DONE for j in job_ids),
        BURST_SECONDS,
        "every job to end",
        interval=0.5,
        state=states,
    )
    assert set(states().values()) == {"JOB_STATE_SUCCEEDED"}, states()


def assert_launched_once(cluster: Minicluster) -> None:
    """Each Mesos task id (one attempt of one task) reached an agent once, under one framework
    (the leaders' shared id)."""
    tasks = cluster.tasks()
    twice = {t: n for t, n in Counter(t.task_id for t in tasks).items() if n > 1}
    assert not twice, twice
    assert len({t.framework_id for t in tasks}) == 1, {t.framework_id for t in tasks}


def subscribed(cluster: Minicluster) -> list[str]:
    return [f.id for f in cluster.frameworks() if f.connected]


def mesos_connected(proc: DaemonProcess) -> bool:
    return scrape_metrics(proc.metrics_port)[("peloton_mesos_connected", ())] == 1


def some_running(cluster: Minicluster) -> bool:
    return any(t.state == "TASK_RUNNING" for t in cluster.tasks())


@on_postgresql
def test_only_the_leader_subscribes_and_jobs_sent_to_either_daemon_run(
    db_url: str,
    cluster: Minicluster,
    scheduling: dict[str, DaemonProcess],
    clients: dict[str, PelotonClient],
) -> None:
    assert wait_leader(db_url, scheduling, TAKEOVER_SECONDS) == "a"
    wait_for(lambda: subscribed(cluster), START_SECONDS, "a subscribed", state=cluster.frameworks)
    assert len(cluster.frameworks()) == 1, cluster.frameworks()
    assert not mesos_connected(scheduling["b"])
    assert SCHEDULES not in scheduling["b"].stderr
    job_ids = submit_burst([clients["a"], clients["b"]], 4)
    wait_all_done(clients["b"], job_ids)
    assert_launched_once(cluster)
    # A kill through the follower is written there and sent to Mesos by the leader.
    b = clients["b"]
    long = b.create_job(make_spec(1, name="long", command="sleep 60", gpu=1)).job_id
    wait_for(
        lambda: b.get_job(long).state == job_pb2.JOB_STATE_RUNNING,
        START_SECONDS,
        "the long job running",
        state=lambda: b.get_job(long),
    )

    # A follower hears nothing from Mesos and answers host reads from the database: the
    # agents the leader met after b started, and what the running job holds (the leader's view).
    def hosts(client: PelotonClient) -> dict[str, tuple[str, float, float]]:
        return {h.hostname: (h.state, h.used.gpu, h.total.gpu) for h in client.list_hosts()}

    wait_for(
        lambda: hosts(b) == hosts(clients["a"]),
        TAKEOVER_SECONDS,
        "the follower's hosts to be the leader's",
        state=lambda: (hosts(b), hosts(clients["a"])),
    )
    assert sorted(hosts(b)) == ["agent-0", "agent-1"]
    assert sum(used for _, used, _ in hosts(b).values()) == 1
    (host,) = [name for name, (_, used, _) in hosts(b).items() if used]
    assert b.get_host(host).used.gpu == 1
    b.kill_job(long)
    wait_for(
        lambda: b.get_job(long).state == job_pb2.JOB_STATE_KILLED,
        TAKEOVER_SECONDS,
        "the long job killed",
        state=lambda: (b.get_job(long), cluster.tasks()),
    )
    # Pools and host drains change through the leader only; the follower says where to go.
    with pytest.raises(ClientError, match="through the leader") as refused:
        clients["b"].create_pool(pool_pb2.PoolSpec(path="/team", owner="t"))
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(ClientError, match="drain hosts through the leader"):
        clients["b"].drain_host("agent-0")


@on_postgresql
def test_a_killed_leader_mid_burst_is_replaced_and_every_job_runs_once(
    db_url: str,
    cluster: Minicluster,
    scheduling: dict[str, DaemonProcess],
    clients: dict[str, PelotonClient],
) -> None:
    job_ids = submit_burst([clients["a"], clients["b"]])
    wait_for(lambda: some_running(cluster), START_SECONDS, "a gang running", state=cluster.tasks)
    scheduling["a"].kill()
    assert wait_leader(db_url, {"b": scheduling["b"]}, TAKEOVER_SECONDS) == "b"
    wait_all_done(clients["b"], job_ids)
    assert_launched_once(cluster)
    assert len(subscribed(cluster)) == 1, cluster.frameworks()


@on_postgresql
def test_a_paused_leader_resumed_launches_and_writes_nothing(
    db_url: str,
    cluster: Minicluster,
    scheduling: dict[str, DaemonProcess],
    clients: dict[str, PelotonClient],
) -> None:
    a = scheduling["a"]
    job_ids = submit_burst([clients["b"]])
    wait_for(lambda: some_running(cluster), START_SECONDS, "a gang running", state=cluster.tasks)
    a.proc.send_signal(signal.SIGSTOP)
    assert wait_leader(db_url, {"b": scheduling["b"]}, TAKEOVER_SECONDS) == "b"
    wait_for(
        lambda: mesos_connected(scheduling["b"]),
        TAKEOVER_SECONDS,
        "b subscribed to Mesos",
        state=cluster.frameworks,
    )
    before = len(a.stderr)
    # What reached the master while a was paused is all a had sent before the pause.
    sent_before = {ids[0] for t in cluster.tasks() if (ids := parse_attempt_id(t.task_id))}
    a.proc.send_signal(signal.SIGCONT)
    assert a.wait_exit(TAKEOVER_SECONDS) == DEPOSED_EXIT
    resumed = a.stderr[before:]
    assert "lost the leader lease" in resumed, resumed
    # Threads still busy when it decided to exit may log (a status write the database refused
    # fails loudly; a launch whose ACCEPT went out before the pause logs its end), but it
    # launches nothing new after the decision (its own clock stops each launch).
    after = resumed[resumed.index("lost the leader lease") :]
    ended = set(re.findall(r"gang launched job_id=(\S+)", after))
    assert ended <= sent_before, (ended - sent_before, resumed)
    # What it launched and wrote is what it did while it led: a launch it had sent when paused
    # may only log its end now. Any later one is refused (by its own clock, the fence on the
    # database, and Mesos, which refuses the stream b's subscription failed over); so every
    # job ends, each attempt launched once.
    wait_all_done(clients["b"], job_ids)
    assert_launched_once(cluster)
