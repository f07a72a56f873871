"""Run-as users: ``JobSpec.user``, the allow-list (``run_as_file``) checked at CreateJob with the
caller an authenticate hook gives, ``CommandInfo.user`` in every TaskInfo, and the minicluster
running each task as its user (as a ``--switch_user`` Mesos agent running as root does).

Tests that need users create them (``useradd`` with random names, removed afterwards): the
suite runs as root, here and in CI.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from daemon import ROOT, address, in_process_server, wait_for
from hypothesis import given
from hypothesis import strategies as st
from minicluster_support import (
    MiniclusterFactory,
    RawScheduler,
    fixture_make_minicluster,  # noqa: F401
    get,
    task_info,
)
from support import make_spec
from test_hostmgr_offers import raw_offer

from peloton.api.authz import Authorizer
from peloton.api.grpc_server import GrpcServer
from peloton.api.interceptor import Context
from peloton.api.job_service import JobService
from peloton.api.watches import WatchQuotas
from peloton.cli.output import print_job
from peloton.client import ClientError, PelotonClient
from peloton.config import ServerConfig
from peloton.core.access import ANONYMOUS, USER, Caller, Principal
from peloton.core.offers import LaunchTask, Lease
from peloton.core.resources import EXECUTOR_RESOURCES, Resources
from peloton.core.runas import RunAsRule, RunAsRules, check_user_name
from peloton.core.spec import load_job_spec_yaml, validate_job_spec, with_defaults
from peloton.errors import InvalidArgument, PermissionDenied, Unauthenticated
from peloton.hostmgr.launch import launch_group
from peloton.hostmgr.offers import parse_offer
from peloton.jobmgr.manager import JobManager
from peloton.metrics import Metrics
from peloton.minicluster import Minicluster
from peloton.resmgr.pool import PoolTree
from peloton.security.runas import AnyUser, RunAsFile, RunAsMetrics
from peloton.server import Server
from peloton.storage.db import Database
from peloton.v1 import job_pb2, job_pb2_grpc

ALICE = Caller("alice", frozenset({"ml"}), "token")
BOB = Caller("bob", frozenset(), "token")
CAROL = Caller("carol", frozenset({"ml", "ops"}), "jwt")
RULES = [
    {"users": ["alice"], "groups": ["ml"], "run_as": ["alice", "mlbatch"]},
    {"users": ["*"], "run_as": ["$self"]},
    {"groups": ["ops"], "run_as": ["*"]},
    {"users": ["anonymous"], "run_as": ["nobody"]},
]


@pytest.fixture
def users() -> Iterator[Callable[[], str]]:
    """``users()``: a new Unix user (no home), removed after the test."""
    made: list[str] = []

    def make() -> str:
        name = f"pt{uuid.uuid4().hex[:10]}"
        subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
        made.append(name)
        return name

    yield make
    for name in made:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def write_rules(path: Path, rules: Any) -> Path:
    path.write_text(yaml.safe_dump(rules))
    return path


# ---------------------------------------------------------------------- rules (pure)


def test_rules_allow_by_name_group_self_and_any() -> None:
    rules = RunAsRules.parse(RULES)
    assert rules.allows(ALICE, "alice") and rules.allows(ALICE, "mlbatch")
    assert not rules.allows(ALICE, "root")
    assert rules.allows(BOB, "bob")  # "*" callers, as $self
    assert not rules.allows(BOB, "alice") and not rules.allows(BOB, "mlbatch")
    assert rules.allows(CAROL, "mlbatch")  # by group ml
    assert rules.allows(CAROL, "root")  # group ops may run as anyone
    assert rules.allows(ANONYMOUS, "nobody")
    assert not rules.allows(ANONYMOUS, "anonymous") and not rules.allows(ANONYMOUS, "")


def test_the_anonymous_caller_matches_only_entries_for_anonymous() -> None:
    rules = RunAsRules.parse([{"users": ["*"], "groups": ["ml"], "run_as": ["*"]}])
    assert rules.allows(BOB, "root")
    assert not rules.allows(ANONYMOUS, "root")
    assert not RunAsRules.parse([{"users": ["anonymous"], "run_as": ["$self"]}]).allows(
        ANONYMOUS, "anonymous"
    )


def test_an_empty_file_allows_no_one() -> None:
    assert RunAsRules.parse(None).allows(ALICE, "alice") is False


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        ({"users": ["a"]}, "run_as_file", "must be a list"),
        (["alice"], "run_as_file[0]", "must be a mapping"),
        ([{"users": ["a"], "run_as": ["a"], "hosts": []}], "run_as_file[0]", "unknown key 'hosts'"),
        ([{"run_as": ["a"]}], "run_as_file[0]", "names no caller"),
        ([{"users": ["a"]}], "run_as_file[0].run_as", "is required"),
        ([{"users": "alice", "run_as": ["a"]}], "run_as_file[0].users", "must be a list"),
        ([{"users": ["a"], "groups": [""], "run_as": ["a"]}], "run_as_file[0].groups", "not a"),
        (
            [{"users": ["a"], "run_as": ["a"]}, {"users": ["b"], "run_as": ["x y"]}],
            "run_as_file[1].run_as",
            "not a Unix user name",
        ),
    ],
)
def test_a_rule_that_breaks_a_rule_names_its_entry(data: Any, field: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        RunAsRules.parse(data)
    assert info.value.field == field
    assert reason in info.value.reason


names = st.sampled_from(["alice", "bob", "carol", "mlbatch", "root", "nobody"])
callers = st.builds(
    Caller,
    names,
    st.frozensets(st.sampled_from(["ml", "ops", "dev"]), max_size=2),
    st.sampled_from(["token", "jwt", "certificate"]),
) | st.just(ANONYMOUS)
rules_strategy = st.builds(
    RunAsRule,
    st.frozensets(names | st.sampled_from(["*", "anonymous"]), max_size=3),
    st.frozensets(st.sampled_from(["ml", "ops", "dev"]), max_size=2),
    st.frozensets(names | st.sampled_from(["*", "$self"]), min_size=1, max_size=3),
)


@given(st.lists(rules_strategy, max_size=4), rules_strategy, callers, names)
def test_a_rule_more_never_takes_a_permission_away(
    rules: list[RunAsRule], extra: RunAsRule, caller: Caller, user: str
) -> None:
    if RunAsRules(tuple(rules)).allows(caller, user):
        assert RunAsRules((*rules, extra)).allows(caller, user)


@given(st.frozensets(names | st.just("*"), min_size=1), callers, names)
def test_self_never_lets_a_caller_run_as_someone_else(
    users: frozenset[str], caller: Caller, user: str
) -> None:
    rules = RunAsRules((RunAsRule(users, frozenset(), frozenset({"$self"})),))
    if rules.allows(caller, user):
        assert not caller.anonymous and user == caller.name


# ---------------------------------------------------------------------- the job spec's field


def test_the_spec_takes_a_user_from_yaml() -> None:
    text = "name: j\ninstances: 1\nuser: mlbatch\n"
    text += "task: {command: id -un, resources: {cpu: 1, mem_mb: 64}}\n"
    spec = load_job_spec_yaml(text)
    assert spec.user == "mlbatch"
    validate_job_spec(with_defaults(spec))


@pytest.mark.parametrize("user", ["root user", "-rf", "1000", "a" * 33, "al:ice", "ünïcode"])
def test_a_user_that_is_no_unix_name_is_invalid_naming_user(user: str) -> None:
    spec = with_defaults(make_spec(1))
    spec.user = user
    with pytest.raises(InvalidArgument) as info:
        validate_job_spec(spec)
    assert info.value.field == "user"
    with pytest.raises(InvalidArgument):
        check_user_name(user)


def test_job_get_shows_the_user(capsys: pytest.CaptureFixture[str]) -> None:
    def run_as_line(user: str) -> str:
        spec = make_spec(1)
        spec.user = user
        print_job(job_pb2.Job(job_id="j1", spec=spec))
        lines = capsys.readouterr().out.splitlines()
        return next(line for line in lines if line.startswith("Run as:")).split(":", 1)[1].strip()

    assert run_as_line("mlbatch") == "mlbatch"
    assert run_as_line("") == "the framework's user"


# ---------------------------------------------------------------------- the allow-list file


def test_the_file_is_reloaded_when_it_changes_and_a_broken_change_keeps_the_last_rules(
    tmp_path: Path,
) -> None:
    path = write_rules(tmp_path / "run-as.yaml", [{"users": ["alice"], "run_as": ["alice"]}])
    metrics = RunAsMetrics()
    policy = RunAsFile(path, metrics)
    policy.check(ALICE, "alice")
    with pytest.raises(PermissionDenied, match=r"^alice may not run tasks as mlbatch$"):
        policy.check(ALICE, "mlbatch")
    write_rules(path, [{"users": ["alice"], "run_as": ["alice", "mlbatch"], "extra": 1}])
    for _ in range(2):  # broken: the last rules stay, and it is reported once
        with pytest.raises(PermissionDenied):
            policy.check(ALICE, "mlbatch")
    assert metrics.file_errors._value.get() == 1
    write_rules(path, [{"users": ["alice"], "run_as": ["mlbatch"]}])
    policy.check(ALICE, "mlbatch")
    with pytest.raises(PermissionDenied):
        policy.check(ALICE, "alice")
    assert metrics.denied._value.get() == 4
    path.unlink()  # gone: the last rules stay
    policy.check(ALICE, "mlbatch")
    policy.check(ALICE, "mlbatch")
    assert metrics.file_errors._value.get() == 2


def test_a_broken_file_at_start_names_the_option_and_its_entry(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as info:
        RunAsFile(write_rules(tmp_path / "r.yaml", [{"users": ["a"], "run_as": []}]))
    assert info.value.field == "run_as_file[0].run_as"
    with pytest.raises(InvalidArgument) as info:
        RunAsFile(tmp_path / "missing.yaml")
    assert info.value.field == "run_as_file" and "cannot read" in info.value.reason
    (tmp_path / "bad.yaml").write_text("- [unclosed\n")
    with pytest.raises(InvalidArgument) as info:
        RunAsFile(tmp_path / "bad.yaml")
    assert info.value.field == "run_as_file" and "not valid YAML" in info.value.reason


def test_without_a_file_anyone_may_run_as_any_valid_user() -> None:
    AnyUser().check(BOB, "root")
    AnyUser().check(ANONYMOUS, "")
    with pytest.raises(InvalidArgument):
        AnyUser().check(BOB, "not a user")


def test_the_daemon_refuses_to_start_with_a_broken_file(db_url: str, tmp_path: Path) -> None:
    path = write_rules(tmp_path / "r.yaml", [{"users": ["a"]}])
    server = Server(ServerConfig(db_url=db_url, data_dir=tmp_path, run_as_file=str(path)))
    with pytest.raises(InvalidArgument, match=r"run_as_file\[0\]\.run_as"):
        server.start()


# ---------------------------------------------------------------------- CreateJob, over gRPC

USER_HEADER = "x-test-user"


def header_authenticate(method: str, context: Context) -> Caller:
    """The tests' authentication: ``x-test-user: name[:group,group]``; none is the anonymous
    caller (a daemon without authentication), an empty one is refused."""
    for key, value in context.invocation_metadata() or ():
        if key == USER_HEADER:
            name, _, groups = str(value).partition(":")
            if not name:
                raise Unauthenticated("empty x-test-user")
            return Caller(name, frozenset(g for g in groups.split(",") if g), "token")
    return ANONYMOUS


@pytest.fixture
def api(db_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A gRPC server of JobService with :func:`header_authenticate` and a run-as file; yields
    its address and the file."""
    path = write_rules(tmp_path / "run-as.yaml", RULES)
    db = Database.from_url(db_url)
    jobs = JobManager(db)
    metrics = Metrics()
    server = GrpcServer(
        metrics,
        4,
        WatchQuotas(10, 10),
        jobs.jobs_changed_after,
        jobs.newest_event,
        authenticate=header_authenticate,
    )
    # The callers are cluster admins: the pools' permissions are another test's.
    admins = frozenset(Principal(USER, name) for name in ("alice", "bob", "carol", "dave"))
    authz = Authorizer(admins, PoolTree)
    run_as = RunAsFile(path, RunAsMetrics(metrics.registry))
    service = JobService(jobs, server.watches, run_as, authz=authz)
    job_pb2_grpc.add_JobServiceServicer_to_server(service, server.server)
    port = server.bind("127.0.0.1:0", ("peloton.v1.JobService",))
    server.start()
    try:
        yield address(port), path
    finally:
        server.stop(1.0)
        db.dispose()


def create(target: str, user: str, caller: str | None) -> job_pb2.CreateJobResponse:
    spec = make_spec(1)
    spec.user = user
    metadata: tuple[tuple[str, str | bytes], ...] = (
        ((USER_HEADER, caller),) if caller is not None else ()
    )
    with grpc.insecure_channel(target) as channel:
        stub = job_pb2_grpc.JobServiceStub(channel)
        return stub.CreateJob(job_pb2.CreateJobRequest(spec=spec), metadata=metadata, timeout=10)


def refused(target: str, user: str, caller: str | None) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        create(target, user, caller)
    return info.value


def test_create_job_checks_the_callers_run_as_users(api: tuple[str, Path]) -> None:
    target, _ = api
    assert create(target, "alice", "alice").job.spec.user == "alice"
    assert create(target, "mlbatch", "carol:ml").job.spec.user == "mlbatch"
    assert create(target, "dave", "dave").created  # every caller as itself
    assert create(target, "", "bob").created  # the framework's user: not checked
    err = refused(target, "root", "alice")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert err.details() == "alice may not run tasks as root"
    err = refused(target, "alice", "bob")
    assert (err.code(), err.details()) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "bob may not run tasks as alice",
    )
    err = refused(target, "no such", "alice")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.details() or "").startswith("user: ")


def test_without_authentication_the_entries_for_anonymous_apply(api: tuple[str, Path]) -> None:
    target, path = api
    assert create(target, "nobody", None).created
    err = refused(target, "root", None)
    assert (err.code(), err.details()) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "anonymous may not run tasks as root",
    )
    write_rules(path, [{"users": ["anonymous"], "run_as": ["root"]}])  # re-read when changed
    assert create(target, "root", None).created


# ---------------------------------------------------------------------- the TaskInfos


def test_every_task_info_carries_the_user_and_the_executor_none() -> None:
    lease = Lease("lease-1", "h1", "a1", (parse_offer(raw_offer("o1"), 0),), 60)

    def launch(user: str) -> dict[str, Any]:
        tasks = [
            LaunchTask(f"t{i}", f"t{i}", "id -un", {}, Resources(cpu=1, mem_mb=64), user=user)
            for i in range(2)
        ]
        group: dict[str, Any] = launch_group(lease, "fw", "ex", EXECUTOR_RESOURCES, tasks)[
            "launch_group"
        ]
        return group

    group = launch("mlbatch")
    assert [t["command"]["user"] for t in group["task_group"]["tasks"]] == ["mlbatch"] * 2
    # A DEFAULT executor may have no CommandInfo: it runs as the framework's user.
    assert "command" not in group["executor"]
    assert all("user" not in t["command"] for t in launch("")["task_group"]["tasks"])


# ---------------------------------------------------------------------- the minicluster's agents


def _run_dir(sandbox: Path) -> Path:
    return sandbox.parent.parent  # <run>/tasks/<task id>


def test_each_task_of_a_group_runs_as_its_command_user_in_a_sandbox_it_owns(
    make_minicluster: MiniclusterFactory, users: Callable[[], str]
) -> None:
    first, second = users(), users()
    mc: Minicluster = make_minicluster(agents=1, work_dir=None)
    sched = RawScheduler(mc.address).subscribe()  # framework user: this process's (root)
    tasks = []
    for task_id, user in (("as-first", first), ("as-second", second), ("as-framework", "")):
        info = task_info(task_id, "id -un; touch mine")
        if user:
            info["command"]["user"] = user
        tasks.append(info)
    sched.launch_group(sched.offer(), tasks)
    finished = []
    for task_id in ("as-first", "as-second", "as-framework"):
        for state in ("TASK_STARTING", "TASK_RUNNING"):
            sched.ack(sched.update(task_id, state))
        finished.append(sched.update(task_id, "TASK_FINISHED"))
    # As a real master records them (until their last update is acknowledged): the user where
    # the TaskInfo's command names one.
    _, _, body = get(mc.address, "/master/state")
    (framework,) = json.loads(body)["frameworks"]
    users_of = {t["id"]: t.get("user") for t in framework["tasks"]}
    assert users_of == {"as-first": first, "as-second": second, "as-framework": None}
    for status in finished:
        sched.ack(status)
    me = pwd.getpwuid(os.geteuid()).pw_name
    for task_id, user in (("as-first", first), ("as-second", second), ("as-framework", me)):
        sandbox = mc.task(task_id).sandbox
        assert sandbox is not None
        assert (sandbox / "stdout").read_text() == f"{user}\n"
        entry = pwd.getpwnam(user)
        for path in (sandbox, sandbox / "stdout", sandbox / "mine"):
            assert (path.stat().st_uid, path.stat().st_gid) == (entry.pw_uid, entry.pw_gid), path
        # The executor's run directory stays the framework user's.
        assert _run_dir(sandbox).stat().st_uid == os.geteuid()


def test_a_task_user_the_agent_does_not_have_fails_that_task_as_mesos_does(
    make_minicluster: MiniclusterFactory,
) -> None:
    mc: Minicluster = make_minicluster(agents=1, work_dir=None)
    sched = RawScheduler(mc.address).subscribe()
    ghost = f"pt{uuid.uuid4().hex[:10]}"
    bad = task_info("ghost", "true")
    bad["command"]["user"] = ghost
    sched.launch_group(sched.offer(), [bad, task_info("sibling", "sleep 30")])
    for state in ("TASK_STARTING", "TASK_RUNNING"):
        sched.ack(sched.update("ghost", state))
    failed = sched.update("ghost", "TASK_FAILED")
    assert failed["message"] == "Command exited with status 1", failed
    assert "reason" not in failed  # the default executor's report of a container's exit
    sandbox = mc.task("ghost").sandbox
    assert sandbox is not None
    assert (
        sandbox / "stderr"
    ).read_text() == f"Failed to get the uid of user '{ghost}': not found\n"
    # The default executor's rule: the rest of the group is killed.
    wait_for(
        lambda: mc.task("sibling").state == "TASK_KILLED",
        15,
        "the sibling killed",
        state=lambda: mc.task("sibling").state,
    )


# ---------------------------------------------------------------------- end to end


def test_a_job_runs_as_its_allowed_user_restarts_included_and_not_as_another(
    db_url: str,
    tmp_path: Path,
    make_minicluster: MiniclusterFactory,
    users: Callable[[], str],
) -> None:
    allowed, other = users(), users()
    path = write_rules(tmp_path / "run-as.yaml", [{"users": ["anonymous"], "run_as": [allowed]}])
    mc: Minicluster = make_minicluster(agents=1, work_dir=None)
    with (
        in_process_server(
            db_url, tmp_path / "data", mesos_master=mc.address, run_as_file=str(path)
        ) as server,
        PelotonClient(address(server.grpc_port), timeout=10) as client,
    ):
        # Instance 0's first attempt fails (its sibling is killed, maybe before it printed):
        # the gang's restart runs as the user too.
        command = 'id -un; case "$PELOTON_ATTEMPT_ID" in *-0-1) exit 3;; esac'
        spec = make_spec(2, command=command, gpu=0, max_failures=1, backoff_seconds=0)
        spec.user = allowed
        job_id = client.create_job(spec).job_id

        def done() -> job_pb2.Job | None:
            job = client.get_job(job_id)
            terminal = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED)
            return job if job.state in terminal else None

        job = wait_for(done, 60, f"job {job_id} done", state=lambda: client.get_job(job_id))
        assert job.state == job_pb2.JOB_STATE_SUCCEEDED, job
        assert job.spec.user == allowed
        for attempt_id in (f"{job_id}-0-1", f"{job_id}-0-2", f"{job_id}-1-2"):
            sandbox = mc.task(attempt_id).sandbox
            assert sandbox is not None
            assert (sandbox / "stdout").read_text() == f"{allowed}\n"
        spec.user = other
        with pytest.raises(ClientError) as info:
            client.create_job(spec)
        assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert info.value.details == f"anonymous may not run tasks as {other}"


# ---------------------------------------------------------------------- README


def _readme_yaml_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n### Run-as users\n", 1)[1]
    section = section.split("\n## ", 1)[0].split("\n### ", 1)[0].split("\n<!-- ", 1)[0]
    return [block.split("\n```", 1)[0] for block in section.split("```yaml\n")[1:]]


def test_the_readmes_examples_mean_what_it_says() -> None:
    job, rules_text = _readme_yaml_blocks()
    spec = load_job_spec_yaml(job)
    validate_job_spec(with_defaults(spec))
    assert spec.user == "mlbatch"
    rules = RunAsRules.parse(yaml.safe_load(rules_text))
    assert rules == RunAsRules.parse(RULES)  # the rules the tests above hold it to
