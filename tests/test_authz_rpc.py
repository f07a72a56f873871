"""Every RPC against a real in-process daemon with authentication on, for each kind of caller:
none (UNAUTHENTICATED), a user without a grant on the pool, a user with the right grant, and a
cluster admin. The table must cover every method of every service (and each must have a rule),
so that an RPC added without deciding who may call it fails here.

Callers authenticate with real bearer tokens: the daemon reads a tokens file (README "Transport
and identity") holding a token per caller of the test, each written ``NAME[;groups=A,B]`` here."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from daemon import ROOT, address, error_line, in_process_server, run_peloton, wait_for
from support import make_spec

from peloton.api.authz import RULES
from peloton.core.access import GROUP, USER, Grant, Permission, Principal
from peloton.core.pools import PoolConfig
from peloton.security.tokens import token_digest
from peloton.server import Server
from peloton.storage import migrate
from peloton.storage.db import make_engine
from peloton.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    host_pb2,
    host_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    pool_pb2,
    pool_pb2_grpc,
    sweep_pb2,
    sweep_pb2_grpc,
)

C = grpc.StatusCode
SERVICES = (
    job_pb2.DESCRIPTOR.services_by_name["JobService"],
    pool_pb2.DESCRIPTOR.services_by_name["PoolService"],
    host_pb2.DESCRIPTOR.services_by_name["HostService"],
    audit_pb2.DESCRIPTOR.services_by_name["AuditService"],
    sweep_pb2.DESCRIPTOR.services_by_name["SweepService"],
)

# The callers: cluster admins are user root and group sre.
ADMINS = "user:root,group:sre"
STRANGER = "bob"  # no grant anywhere
SUBMITTER = "alice"  # submit on /team/a
VIEWER = "carol;groups=watchers"  # view on /team/a, through a group
POOL_ADMIN = "lead"  # admin on /team
CLUSTER_GROUP = "sam;groups=sre"  # a cluster admin through a group
ROOT_ADMIN = "root"
OTHER_SUBMITTER = "dave"  # submit on /team/a, owns no job


def _grant(kind: str, name: str, permission: Permission) -> Grant:
    return Grant(Principal(kind, name), permission)


POOLS = (
    PoolConfig("/team", grants=(_grant(USER, "lead", Permission.ADMIN),)),
    PoolConfig(
        "/team/a",
        grants=(
            _grant(USER, "alice", Permission.SUBMIT),
            _grant(USER, "dave", Permission.SUBMIT),
            _grant(GROUP, "watchers", Permission.VIEW),
        ),
    ),
)


CALLERS = (STRANGER, SUBMITTER, VIEWER, POOL_ADMIN, CLUSTER_GROUP, ROOT_ADMIN, OTHER_SUBMITTER)


def token_of(who: str) -> str:
    """The bearer token of a caller of the test."""
    return hashlib.sha256(f"the test's token of {who}".encode()).hexdigest()


def tokens_file(path: Path) -> str:
    """A tokens file with every caller's token: its user and groups as ``NAME;groups=A,B``."""
    entries = []
    for who in CALLERS:
        name, _, rest = who.partition(";")
        groups = [g for g in rest.removeprefix("groups=").split(",") if g]
        entries.append({"user": name, "groups": groups, "sha256": token_digest(token_of(who))})
    path.write_text(yaml.safe_dump({"tokens": entries}))
    return str(path)


@dataclass
class Env:
    server: Server
    channel: grpc.Channel

    @property
    def jobs(self) -> job_pb2_grpc.JobServiceStub:
        return job_pb2_grpc.JobServiceStub(self.channel)

    @property
    def pools(self) -> pool_pb2_grpc.PoolServiceStub:
        return pool_pb2_grpc.PoolServiceStub(self.channel)

    @property
    def hosts(self) -> host_pb2_grpc.HostServiceStub:
        return host_pb2_grpc.HostServiceStub(self.channel)

    @property
    def audit(self) -> audit_pb2_grpc.AuditServiceStub:
        return audit_pb2_grpc.AuditServiceStub(self.channel)

    @property
    def sweeps(self) -> sweep_pb2_grpc.SweepServiceStub:
        return sweep_pb2_grpc.SweepServiceStub(self.channel)

    def sweep(self) -> str:
        """A new sweep in /team/a submitted by SUBMITTER."""
        request = sweep_pb2.SubmitSweepRequest(spec=sweep_spec())
        return self.sweeps.SubmitSweep(request, metadata=md(SUBMITTER)).sweep.sweep_id

    def job(self, pool: str = "/team/a", owner: str = SUBMITTER) -> str:
        """A new PENDING job (no Mesos: it stays so) in ``pool`` created by ``owner``."""
        assert self.server.jobs is not None
        job, _ = self.server.jobs.create_job(make_spec(pool=pool), owner=owner)
        return job.id

    def pool(self, path: str) -> str:
        assert self.server.resmgr is not None
        self.server.resmgr.create_pool(PoolConfig(path))
        return path


def sweep_spec() -> sweep_pb2.SweepSpec:
    spec = sweep_pb2.SweepSpec(
        name="sweep",
        trial=make_spec(1, pool="/team/a"),
        objective=sweep_pb2.Objective(metric="loss"),
        max_trials=1,
    )
    spec.space["lr"].uniform.high = 1.0
    return spec


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    tokens = tokens_file(tmp_path / "tokens.yaml")
    with in_process_server(
        url, tmp_path / "data", pools=(), admins=ADMINS, auth_tokens_file=tokens
    ) as server:
        assert server.resmgr is not None
        for config in POOLS:
            server.resmgr.create_pool(config)
        with grpc.insecure_channel(address(server.grpc_port)) as channel:
            yield Env(server, channel)


def md(who: str | None) -> tuple[tuple[str, str], ...]:
    return () if who is None else (("authorization", f"Bearer {token_of(who)}"),)


def code_of(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return C.OK


def tag(who: str | None) -> str:
    """A pool name segment per caller, so that each creates its own pool."""
    return (who or "nobody").split(";")[0]


# An RPC made as a caller (its header value, None for none); raises grpc.RpcError on failure.
Call = Callable[[Env, str | None], Any]


@dataclass(frozen=True)
class Case:
    call: Call
    granted: str  # a caller with the grant the RPC needs, and no more than that
    allowed: grpc.StatusCode  # what the RPC answers a caller it lets through
    anyone: bool = False  # any authenticated caller is let through (the stranger too)


def _watch(e: Env, who: str | None) -> None:
    stream = e.jobs.WatchJob(job_pb2.WatchJobRequest(job_id=e.job()), metadata=md(who), timeout=10)
    try:
        next(stream)  # the job's first event: the stream is open
    finally:
        stream.cancel()


def _update_team_a(e: Env, who: str | None) -> Any:
    current = e.pools.GetPool(pool_pb2.GetPoolRequest(path="/team/a"), metadata=md(ROOT_ADMIN))
    return e.pools.UpdatePool(pool_pb2.UpdatePoolRequest(spec=current.pool.spec), metadata=md(who))


J, P, H = job_pb2, pool_pb2, host_pb2
CASES: dict[str, Case] = {
    "/peloton.v1.JobService/CreateJob": Case(
        lambda e, w: e.jobs.CreateJob(
            J.CreateJobRequest(spec=make_spec(pool="/team/a")), metadata=md(w)
        ),
        SUBMITTER,
        C.OK,
    ),
    "/peloton.v1.JobService/GetJob": Case(
        lambda e, w: e.jobs.GetJob(J.GetJobRequest(job_id=e.job()), metadata=md(w)), VIEWER, C.OK
    ),
    "/peloton.v1.JobService/ListJobs": Case(
        lambda e, w: e.jobs.ListJobs(J.ListJobsRequest(pool="/team/a"), metadata=md(w)),
        VIEWER,
        C.OK,
    ),
    "/peloton.v1.JobService/KillJob": Case(
        lambda e, w: e.jobs.KillJob(J.KillJobRequest(job_id=e.job()), metadata=md(w)),
        SUBMITTER,  # its owner
        C.OK,
    ),
    "/peloton.v1.JobService/RestartJob": Case(
        lambda e, w: e.jobs.RestartJob(J.RestartJobRequest(job_id=e.job()), metadata=md(w)),
        SUBMITTER,
        C.FAILED_PRECONDITION,  # a PENDING job does not restart
    ),
    "/peloton.v1.JobService/DeleteJob": Case(
        lambda e, w: e.jobs.DeleteJob(J.DeleteJobRequest(job_id=e.job()), metadata=md(w)),
        SUBMITTER,
        C.FAILED_PRECONDITION,  # it has not ended
    ),
    "/peloton.v1.JobService/GetTask": Case(
        lambda e, w: e.jobs.GetTask(J.GetTaskRequest(job_id=e.job()), metadata=md(w)), VIEWER, C.OK
    ),
    "/peloton.v1.JobService/ListTasks": Case(
        lambda e, w: e.jobs.ListTasks(J.ListTasksRequest(job_id=e.job()), metadata=md(w)),
        VIEWER,
        C.OK,
    ),
    "/peloton.v1.JobService/WatchJob": Case(_watch, VIEWER, C.OK),
    "/peloton.v1.PoolService/CreatePool": Case(
        lambda e, w: e.pools.CreatePool(
            P.CreatePoolRequest(spec=P.PoolSpec(path=f"/team/new-{tag(w)}")), metadata=md(w)
        ),
        POOL_ADMIN,  # admin on the parent
        C.OK,
    ),
    "/peloton.v1.PoolService/UpdatePool": Case(_update_team_a, POOL_ADMIN, C.OK),
    "/peloton.v1.PoolService/DeletePool": Case(
        lambda e, w: e.pools.DeletePool(
            P.DeletePoolRequest(path=e.pool(f"/team/old-{tag(w)}")), metadata=md(w)
        ),
        POOL_ADMIN,
        C.OK,
    ),
    "/peloton.v1.PoolService/GetPool": Case(
        lambda e, w: e.pools.GetPool(P.GetPoolRequest(path="/team"), metadata=md(w)),
        STRANGER,
        C.OK,
        anyone=True,
    ),
    "/peloton.v1.PoolService/ListPools": Case(
        lambda e, w: e.pools.ListPools(P.ListPoolsRequest(), metadata=md(w)),
        STRANGER,
        C.OK,
        anyone=True,
    ),
    "/peloton.v1.HostService/ListHosts": Case(
        lambda e, w: e.hosts.ListHosts(H.ListHostsRequest(), metadata=md(w)),
        STRANGER,
        C.OK,
        anyone=True,
    ),
    "/peloton.v1.HostService/GetHost": Case(
        lambda e, w: e.hosts.GetHost(H.GetHostRequest(hostname="gpu-1"), metadata=md(w)),
        STRANGER,
        C.NOT_FOUND,  # no such host: the check let it through
        anyone=True,
    ),
    "/peloton.v1.HostService/DrainHost": Case(
        lambda e, w: e.hosts.DrainHost(H.DrainHostRequest(hostname="gpu-1"), metadata=md(w)),
        CLUSTER_GROUP,
        C.NOT_FOUND,
    ),
    "/peloton.v1.HostService/UndrainHost": Case(
        lambda e, w: e.hosts.UndrainHost(H.UndrainHostRequest(hostname="gpu-1"), metadata=md(w)),
        CLUSTER_GROUP,
        C.NOT_FOUND,
    ),
    "/peloton.v1.HostService/GetTaskLogs": Case(
        lambda e, w: e.hosts.GetTaskLogs(H.GetTaskLogsRequest(job_id=e.job()), metadata=md(w)),
        VIEWER,
        C.FAILED_PRECONDITION,  # the task has not been launched
    ),
    "/peloton.v1.HostService/GetTaskGpus": Case(
        lambda e, w: e.hosts.GetTaskGpus(H.GetTaskGpusRequest(job_id=e.job()), metadata=md(w)),
        VIEWER,
        C.FAILED_PRECONDITION,
    ),
    "/peloton.v1.SweepService/SubmitSweep": Case(
        lambda e, w: e.sweeps.SubmitSweep(
            sweep_pb2.SubmitSweepRequest(spec=sweep_spec()), metadata=md(w)
        ),
        SUBMITTER,
        C.OK,
    ),
    "/peloton.v1.SweepService/GetSweep": Case(
        lambda e, w: e.sweeps.GetSweep(
            sweep_pb2.GetSweepRequest(sweep_id=e.sweep()), metadata=md(w)
        ),
        VIEWER,
        C.OK,
    ),
    "/peloton.v1.SweepService/ListSweeps": Case(
        lambda e, w: e.sweeps.ListSweeps(sweep_pb2.ListSweepsRequest(), metadata=md(w)),
        STRANGER,
        C.OK,
        anyone=True,
    ),
    "/peloton.v1.SweepService/ListTrials": Case(
        lambda e, w: e.sweeps.ListTrials(
            sweep_pb2.ListTrialsRequest(sweep_id=e.sweep()), metadata=md(w)
        ),
        VIEWER,
        C.OK,
    ),
    "/peloton.v1.SweepService/KillSweep": Case(
        lambda e, w: e.sweeps.KillSweep(
            sweep_pb2.KillSweepRequest(sweep_id=e.sweep()), metadata=md(w)
        ),
        POOL_ADMIN,
        C.OK,
    ),
    # Any caller may report; the trial's report token decides (here: no such trial).
    "/peloton.v1.SweepService/ReportMetrics": Case(
        lambda e, w: e.sweeps.ReportMetrics(
            sweep_pb2.ReportMetricsRequest(job_id="no-such-job", metrics={"loss": 1.0}),
            metadata=md(w),
        ),
        STRANGER,
        C.INVALID_ARGUMENT,
        anyone=True,
    ),
    "/peloton.v1.AuditService/ListAuditRecords": Case(
        lambda e, w: e.audit.ListAuditRecords(audit_pb2.ListAuditRecordsRequest(), metadata=md(w)),
        CLUSTER_GROUP,
        C.OK,
    ),
}


def all_methods() -> set[str]:
    return {f"/{s.full_name}/{m.name}" for s in SERVICES for m in s.methods}


def test_every_rpc_has_a_rule_and_a_case() -> None:
    methods = all_methods()
    assert methods - set(RULES) == set(), "RPCs without an authorization rule"
    assert set(RULES) - methods == set(), "rules of RPCs that do not exist"
    assert methods - set(CASES) == set(), "RPCs this test does not call"


def test_every_rpc_as_each_kind_of_caller(env: Env) -> None:
    wrong: list[str] = []
    for method in sorted(all_methods()):
        case = CASES[method]
        expected = {
            None: C.UNAUTHENTICATED,
            STRANGER: case.allowed if case.anyone else C.PERMISSION_DENIED,
            case.granted: case.allowed,
            ROOT_ADMIN: case.allowed,
        }
        for who, code in expected.items():
            got = code_of(lambda: case.call(env, who))  # noqa: B023 (called at once)
            if got != code:
                wrong.append(f"{method} as {who}: {got.name}, expected {code.name}")
    assert wrong == []


def test_granted_callers_get_no_more_than_their_grant(env: Env) -> None:
    def code(method: str, who: str) -> grpc.StatusCode:
        return code_of(lambda: CASES[method].call(env, who))

    jobs = "/peloton.v1.JobService/"
    # View is not submit; submit is not admin over other people's jobs.
    assert code(jobs + "CreateJob", VIEWER) == C.PERMISSION_DENIED
    assert code(jobs + "KillJob", VIEWER) == C.PERMISSION_DENIED
    assert code(jobs + "KillJob", OTHER_SUBMITTER) == C.PERMISSION_DENIED
    # Admin on /team reaches /team/a below it, and anyone's job there.
    assert code(jobs + "KillJob", POOL_ADMIN) == C.OK
    assert code(jobs + "GetJob", POOL_ADMIN) == C.OK
    # A pool admin is no cluster admin; a submitter administers no pool.
    assert code("/peloton.v1.HostService/DrainHost", POOL_ADMIN) == C.PERMISSION_DENIED
    assert code("/peloton.v1.PoolService/CreatePool", SUBMITTER) == C.PERMISSION_DENIED
    assert code("/peloton.v1.AuditService/ListAuditRecords", POOL_ADMIN) == C.PERMISSION_DENIED


def _denied(call: Callable[[], Any]) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == C.PERMISSION_DENIED
    return str(info.value.details())


def test_denials_name_caller_permission_and_pool_and_are_counted(env: Env) -> None:
    registry = env.server.metrics.registry

    def denied(permission: str) -> float:
        value = registry.get_sample_value(
            "peloton_permission_denied_total", {"permission": permission}
        )
        return value or 0.0

    assert denied("submit") == 0
    submit = J.CreateJobRequest(spec=make_spec(pool="/team/a"))
    message = _denied(lambda: env.jobs.CreateJob(submit, metadata=md(STRANGER)))
    assert message == "bob may not submit to /team/a (needs submit)"
    assert denied("submit") == 1

    job_id = env.job()
    kill = J.KillJobRequest(job_id=job_id)
    message = _denied(lambda: env.jobs.KillJob(kill, metadata=md(OTHER_SUBMITTER)))
    assert message == (
        f"dave may not kill job {job_id} in /team/a (needs admin, or submit as the job's owner)"
    )
    assert denied("admin") == 1

    top = P.CreatePoolRequest(spec=P.PoolSpec(path="/top"))
    message = _denied(lambda: env.pools.CreatePool(top, metadata=md(POOL_ADMIN)))
    assert message == "lead may not create pool /top (needs cluster admin)"
    assert env.pools.CreatePool(top, metadata=md(ROOT_ADMIN)).pool.spec.path == "/top"

    child = P.CreatePoolRequest(spec=P.PoolSpec(path="/team/a/x"))
    message = _denied(lambda: env.pools.CreatePool(child, metadata=md(SUBMITTER)))
    assert message == "alice may not create pool /team/a/x (needs admin on /team/a)"


def test_jobs_have_owners_and_lists_show_only_viewable_pools(env: Env) -> None:
    created = env.jobs.CreateJob(
        J.CreateJobRequest(spec=make_spec(pool="/team/a")), metadata=md(SUBMITTER)
    ).job
    assert created.owner == "alice"
    got = env.jobs.GetJob(J.GetJobRequest(job_id=created.job_id), metadata=md(VIEWER)).job
    assert got.owner == "alice"
    elsewhere = env.jobs.CreateJob(
        J.CreateJobRequest(spec=make_spec(pool="/default")), metadata=md(ROOT_ADMIN)
    ).job
    assert elsewhere.owner == "root"

    def listed(who: str) -> set[str]:
        answer = env.jobs.ListJobs(J.ListJobsRequest(), metadata=md(who))
        return {j.job_id for j in answer.jobs}

    assert listed(STRANGER) == set()
    assert listed(VIEWER) == {created.job_id}
    assert listed(POOL_ADMIN) == {created.job_id}
    assert listed(CLUSTER_GROUP) == {created.job_id, elsewhere.job_id}
    # A pool filter the caller may not view is refused, not answered empty.
    other = J.ListJobsRequest(pool="/default")
    message = _denied(lambda: env.jobs.ListJobs(other, metadata=md(VIEWER)))
    assert message == "carol may not list the jobs of /default (needs view)"


def test_grants_through_the_api_take_effect_at_once(env: Env) -> None:
    spec = P.PoolSpec(
        path="/team/b",
        grants=[P.Grant(user="bob", permission=P.PERMISSION_SUBMIT)],
    )
    created = env.pools.CreatePool(P.CreatePoolRequest(spec=spec), metadata=md(POOL_ADMIN))
    assert list(created.pool.spec.grants) == list(spec.grants)
    submit = J.CreateJobRequest(spec=make_spec(pool="/team/b"))
    assert env.jobs.CreateJob(submit, metadata=md(STRANGER)).job.owner == "bob"
    bad = P.PoolSpec(
        path="/team/c", grants=[P.Grant(user="x", group="y", permission=P.PERMISSION_VIEW)]
    )
    with pytest.raises(grpc.RpcError) as info:
        env.pools.CreatePool(P.CreatePoolRequest(spec=bad), metadata=md(POOL_ADMIN))
    assert info.value.code() == C.INVALID_ARGUMENT
    assert info.value.details() == "grants[0]: give exactly one of user and group"


def test_pool_cli_takes_grants_and_shows_them(tmp_path: Path, db_url: str) -> None:
    # A daemon without authentication: the anonymous caller may do everything.
    with in_process_server(db_url, tmp_path / "data", pools=("/research",)) as server:
        where = address(server.grpc_port)
        pool_file = tmp_path / "vision.yaml"
        pool_file.write_text("path: /research/vision\ngrants:\n  - view=group:ml\n")
        made = run_peloton(
            "pool", "create", str(pool_file), "--grant", "submit=user:alice", server=where
        )
        assert made.returncode == 0, made.stderr
        shown = run_peloton("pool", "get", "/research/vision", "-o", "json", server=where)
        assert json.loads(shown.stdout)["spec"]["grants"] == [
            {"user": "", "group": "ml", "permission": "PERMISSION_VIEW"},
            {"user": "alice", "group": "", "permission": "PERMISSION_SUBMIT"},
        ]
        table = run_peloton("pool", "get", "/research/vision", server=where)
        assert "Grants:   view=group:ml, submit=user:alice" in table.stdout
        bad = run_peloton(
            "pool", "update", str(pool_file), "--grant", "own=user:alice", server=where
        )
        assert bad.returncode != 0
        assert error_line(bad) == (
            "error: invalid: --grant[0]: unknown permission 'own'; one of view, submit, admin"
        )

        # Job owners: `job get` shows one, `job list` has a column once any job has one.
        assert server.jobs is not None
        assert "OWNER" not in run_peloton("job", "list", server=where).stdout
        job, _ = server.jobs.create_job(make_spec(pool="/research/vision"), owner="alice")
        got = run_peloton("job", "get", job.id, server=where).stdout
        assert re.search(r"^Owner: +alice$", got, flags=re.M), got
        listed = run_peloton("job", "list", server=where).stdout.splitlines()
        assert listed[0].split()[:4] == ["JOB", "NAME", "POOL", "OWNER"]
        assert listed[-1].split()[3] == "alice"


def _readme_commands() -> list[list[str]]:
    """The commands of README's "Pools and permissions" shell block, without ``peloton``."""
    readme = (ROOT / "README.md").read_text()
    part = readme.split("\n### Pools and permissions\n", 1)[1].split("\n<!-- ", 1)[0]
    (block,) = re.findall(r"^```sh\n(.*?)^```$", part, flags=re.S | re.M)
    commands = [shlex.split(line) for line in block.splitlines() if line.strip()]
    assert all(c[0] == "peloton" for c in commands), commands
    return [c[1:] for c in commands]


def test_readme_example_runs(tmp_path: Path, db_url: str) -> None:
    with in_process_server(db_url, tmp_path / "data", pools=()) as server:
        where = address(server.grpc_port)
        results = [run_peloton(*args, server=where) for args in _readme_commands()]
        assert [r.returncode for r in results] == [0] * len(results), [r.stderr for r in results]
        assert "Grants:   submit=group:vision, view=group:ml" in results[-1].stdout
        assert server.resmgr is not None
        assert [str(g) for g in server.resmgr.pool_tree().get("/research").grants] == [
            "admin=user:lead"
        ]


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_follower_decides_from_the_grants_the_leader_stored(db_url: str, tmp_path: Path) -> None:
    """Several daemons: each answers from the pool tree it serves, which a follower re-reads."""
    options = {"admins": ADMINS, "auth_tokens_file": tokens_file(tmp_path / "tokens.yaml")}
    with (
        in_process_server(db_url, tmp_path / "a", pools=(), daemon_id="a", **options) as a,
        in_process_server(db_url, tmp_path / "b", pools=(), daemon_id="b", **options) as b,
    ):
        leader = wait_for(
            lambda: next((s for s in (a, b) if s.leads()), None), 30, "a daemon to lead"
        )
        follower = b if leader is a else a
        with (
            grpc.insecure_channel(address(leader.grpc_port)) as to_leader,
            grpc.insecure_channel(address(follower.grpc_port)) as to_follower,
        ):
            pools = pool_pb2_grpc.PoolServiceStub(to_leader)
            jobs = job_pb2_grpc.JobServiceStub(to_follower)
            spec = P.PoolSpec(path="/team")
            pools.CreatePool(P.CreatePoolRequest(spec=spec), metadata=md(ROOT_ADMIN))
            submit = J.CreateJobRequest(spec=make_spec(pool="/team"))

            def alice_submits() -> grpc.StatusCode:
                return code_of(lambda: jobs.CreateJob(submit, metadata=md(SUBMITTER)))

            # The follower knows the pool (a cluster admin may submit to it there), and that
            # alice has no grant on it.
            wait_for(
                lambda: code_of(lambda: jobs.CreateJob(submit, metadata=md(ROOT_ADMIN))) == C.OK,
                10,
                "the follower to see /team",
                interval=0.1,
            )
            assert alice_submits() == C.PERMISSION_DENIED
            spec.grants.append(P.Grant(user="alice", permission=P.PERMISSION_SUBMIT))
            pools.UpdatePool(P.UpdatePoolRequest(spec=spec), metadata=md(ROOT_ADMIN))
            wait_for(
                lambda: alice_submits() == C.OK,
                10,
                "the follower to let alice submit",
                interval=0.1,
                state=alice_submits,
            )
