"""SweepService and the sweep controller against a real in-process daemon (no Mesos: the
test moves the trials' tasks itself) on SQLite and PostgreSQL: trials become jobs, metrics
reported with a trial's token are stored per step, ASHA stops weak trials (STOPPED, their jobs
killed), a NaN fails a trial, a sweep survives a restart, and bad input is refused naming the
field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from daemon import address, drive, in_process_server, wait_for
from support import TO_RUNNING

from peloton.core.states import JobState, TaskState
from peloton.server import Server
from peloton.sweep.report import report
from peloton.v1 import common_pb2, job_pb2, sweep_pb2, sweep_pb2_grpc

S = sweep_pb2


def sweep_spec(**over: object) -> S.SweepSpec:
    spec = S.SweepSpec(
        name="lr-sweep",
        trial=job_pb2.JobSpec(
            pool="/research/vision",
            instances=1,
            task=job_pb2.TaskSpec(
                command="python train.py --lr {lr}",
                resources=common_pb2.Resources(cpu=1, mem_mb=64, gpu=1),
            ),
        ),
        objective=S.Objective(metric="loss"),
        max_trials=6,
        parallel_trials=3,
        seed=1,
    )
    spec.space["lr"].log_uniform.low = 0.001
    spec.space["lr"].log_uniform.high = 1.0
    spec.early_stopping.asha.min_step = 1
    spec.early_stopping.asha.max_step = 9
    for key, value in over.items():
        setattr(spec, key, value)
    return spec


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    with in_process_server(db_url, tmp_path / "data") as s:
        yield s


@pytest.fixture
def stub(server: Server) -> Iterator[sweep_pb2_grpc.SweepServiceStub]:
    with grpc.insecure_channel(address(server.grpc_port)) as channel:
        yield sweep_pb2_grpc.SweepServiceStub(channel)


def trials(stub: sweep_pb2_grpc.SweepServiceStub, sweep_id: str) -> list[S.Trial]:
    return list(stub.ListTrials(S.ListTrialsRequest(sweep_id=sweep_id), timeout=10).trials)


def started(stub: sweep_pb2_grpc.SweepServiceStub, sweep_id: str, n: int) -> list[S.Trial]:
    """Until ``n`` trials have jobs; those trials, by index."""
    return wait_for(
        lambda: (
            sorted(ts, key=lambda t: t.index)
            if len(ts := [t for t in trials(stub, sweep_id) if t.job_id]) == n
            else None
        ),
        15,
        f"{n} trials with jobs",
        state=lambda: trials(stub, sweep_id),
    )


def succeeded(stub: sweep_pb2_grpc.SweepServiceStub, sweep_id: str) -> None:
    """Until the sweep SUCCEEDED (shown as it is on timeout)."""

    def sweep() -> S.Sweep:
        return stub.GetSweep(S.GetSweepRequest(sweep_id=sweep_id), timeout=10).sweep

    wait_for(
        lambda: sweep().state == S.SWEEP_STATE_SUCCEEDED, 15, "the sweep SUCCEEDED", state=sweep
    )


def env_of(server: Server, job_id: str) -> dict[str, str]:
    """What the trial's tasks get in their environment (the attempt's parts as the launcher
    would add them)."""
    assert server.jobs is not None
    env = dict(server.jobs.get_job(job_id).spec.task.env)
    return env | {"PELOTON_JOB_ID": job_id, "PELOTON_ATTEMPT_ID": f"{job_id}-0-1"}


def state_of(stub: sweep_pb2_grpc.SweepServiceStub, sweep_id: str, index: int) -> str:
    trial = next(t for t in trials(stub, sweep_id) if t.index == index)
    return S.TrialState.Name(trial.state)


def test_trials_run_as_jobs_and_asha_stops_the_weak_ones(
    server: Server, stub: sweep_pb2_grpc.SweepServiceStub
) -> None:
    sweep = stub.SubmitSweep(S.SubmitSweepRequest(spec=sweep_spec()), timeout=10).sweep
    assert sweep.state == S.SWEEP_STATE_RUNNING
    first = started(stub, sweep.sweep_id, 3)
    assert server.jobs is not None
    for t in first:
        job = server.jobs.get_job(t.job_id)
        assert job.spec.labels["sweep"] == sweep.sweep_id
        assert job.spec.task.command == f"python train.py --lr {t.params['lr']}"
    # Trial 0 leads at the first rung; 1 and 2 are not in its best max(1, 3 // 3) = 1.
    for t, loss in zip(first, (0.1, 0.5, 0.9), strict=True):
        assert report(1, {"loss": loss, "accuracy": 1 - loss}, env=env_of(server, t.job_id)) in (
            False,
            True,
        )
    wait_for(
        lambda: (
            [state_of(stub, sweep.sweep_id, i) for i in (0, 1, 2)]
            == ["TRIAL_STATE_RUNNING", "TRIAL_STATE_STOPPED", "TRIAL_STATE_STOPPED"]
        ),
        15,
        "trials 1 and 2 stopped",
        state=lambda: trials(stub, sweep.sweep_id),
    )
    stopped = next(t for t in trials(stub, sweep.sweep_id) if t.index == 1)
    # Judged as the reports came: against 2 or 3 trials at the rung.
    assert stopped.reason.startswith("ASHA: not in the best 1 of ")
    assert stopped.reason.endswith(" trials at rung step 1")
    job = server.jobs.get_job(stopped.job_id)
    assert job.state in (JobState.KILLING, JobState.KILLED)
    assert job.message == f"stopped early: {stopped.reason}"
    # A stopped trial's next report is told to stop.
    assert report(2, {"loss": 0.4}, env=env_of(server, stopped.job_id)) is True
    # Their GPUs start the next trials; the best so far is shown first.
    started(stub, sweep.sweep_id, 5)
    listed = trials(stub, sweep.sweep_id)
    assert listed[0].index == 0 and listed[0].best == pytest.approx(0.1)
    got = stub.GetSweep(S.GetSweepRequest(sweep_id=sweep.sweep_id), timeout=10).sweep
    assert got.best == pytest.approx(0.1) and got.best_trial == 0
    assert got.trials["stopped"] == 2 and got.trials["running"] == 3


def test_a_stopped_trial_s_gpus_start_no_trial_until_its_tasks_have_left(
    server: Server, stub: sweep_pb2_grpc.SweepServiceStub
) -> None:
    """The budget counts a stopped trial's GPUs until its job's tasks are gone (their kill
    grace): a sweep never holds more than its budget (3 GPUs here: 3 trials of one)."""
    sweep = stub.SubmitSweep(S.SubmitSweepRequest(spec=sweep_spec()), timeout=10).sweep
    first = started(stub, sweep.sweep_id, 3)
    for t in first:
        drive(server, t.job_id, [0], TO_RUNNING)  # running: a kill takes its grace
    for t, loss in zip(first, (0.1, 0.5, 0.9), strict=True):
        report(1, {"loss": loss}, env=env_of(server, t.job_id))
    wait_for(
        lambda: [state_of(stub, sweep.sweep_id, i) for i in (1, 2)] == ["TRIAL_STATE_STOPPED"] * 2,
        15,
        "trials 1 and 2 stopped",
        state=lambda: trials(stub, sweep.sweep_id),
    )
    assert server.jobs is not None
    jobs = server.jobs
    wait_for(  # recorded STOPPED first, then killed
        lambda: {jobs.get_job(t.job_id).state for t in first[1:]} == {JobState.KILLING},
        15,
        "their jobs KILLING",
        state=lambda: [jobs.get_job(t.job_id).state for t in first],
    )
    drive(server, first[1].job_id, [0], [TaskState.KILLED])  # one leaves; the other still holds
    started(stub, sweep.sweep_id, 4)
    # The pass that started the fourth would have started a fifth had trial 2's GPU been free,
    # and every pass since saw its job still KILLING.
    assert len([t for t in trials(stub, sweep.sweep_id) if t.job_id]) == 4
    drive(server, first[2].job_id, [0], [TaskState.KILLED])
    started(stub, sweep.sweep_id, 5)


def test_a_trial_that_reports_nan_fails_and_one_that_ends_silent_fails(
    server: Server, stub: sweep_pb2_grpc.SweepServiceStub
) -> None:
    spec = sweep_spec(max_trials=2, parallel_trials=2)
    spec.ClearField("early_stopping")
    sweep = stub.SubmitSweep(S.SubmitSweepRequest(spec=spec), timeout=10).sweep
    a, b = started(stub, sweep.sweep_id, 2)
    report(1, {"loss": float("nan")}, env=env_of(server, a.job_id))
    wait_for(
        lambda: state_of(stub, sweep.sweep_id, 0) == "TRIAL_STATE_FAILED",
        15,
        "trial 0 failed",
    )
    failed = next(t for t in trials(stub, sweep.sweep_id) if t.index == 0)
    assert failed.reason == "reported loss that is not a number at step 1"
    drive(server, b.job_id, [0], (*TO_RUNNING, TaskState.SUCCEEDED))
    succeeded(stub, sweep.sweep_id)
    assert state_of(stub, sweep.sweep_id, 1) == "TRIAL_STATE_FAILED"
    got = stub.GetSweep(S.GetSweepRequest(sweep_id=sweep.sweep_id)).sweep
    assert got.reason == "no trial reported the objective"


def test_the_best_trial_wins_when_every_trial_succeeds(
    server: Server, stub: sweep_pb2_grpc.SweepServiceStub
) -> None:
    spec = sweep_spec(max_trials=2, parallel_trials=2)
    spec.objective.maximize = True
    spec.ClearField("early_stopping")
    sweep = stub.SubmitSweep(S.SubmitSweepRequest(spec=spec), timeout=10).sweep
    for t, acc in zip(started(stub, sweep.sweep_id, 2), (0.7, 0.9), strict=True):
        report(5, {"loss": acc}, env=env_of(server, t.job_id))
        drive(server, t.job_id, [0], (*TO_RUNNING, TaskState.SUCCEEDED))
    succeeded(stub, sweep.sweep_id)
    got = stub.GetSweep(S.GetSweepRequest(sweep_id=sweep.sweep_id)).sweep
    assert (got.best_trial, got.reason) == (1, "best trial 1: loss 0.9")
    assert got.trials["succeeded"] == 2


def test_a_report_needs_the_trials_token(
    server: Server, stub: sweep_pb2_grpc.SweepServiceStub
) -> None:
    sweep = stub.SubmitSweep(S.SubmitSweepRequest(spec=sweep_spec()), timeout=10).sweep
    trial = started(stub, sweep.sweep_id, 3)[0]
    env = env_of(server, trial.job_id) | {"SWEEP_TOKEN": "guessed"}
    with pytest.raises(grpc.RpcError) as err:
        report(1, {"loss": 0.1}, env=env)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "token" in str(err.value.details())
    # Not rank 0: nothing is sent.
    assert report(1, {"loss": 0.1}, env=env | {"PELOTON_RANK": "1"}) is False


def test_kill_ends_the_sweep_and_its_trials(
    server: Server, stub: sweep_pb2_grpc.SweepServiceStub
) -> None:
    sweep = stub.SubmitSweep(S.SubmitSweepRequest(spec=sweep_spec()), timeout=10).sweep
    jobs = [t.job_id for t in started(stub, sweep.sweep_id, 3)]
    killed = stub.KillSweep(S.KillSweepRequest(sweep_id=sweep.sweep_id, message="enough")).sweep
    assert (killed.state, killed.reason) == (S.SWEEP_STATE_KILLED, "enough")
    assert {t.state for t in trials(stub, sweep.sweep_id)} == {S.TRIAL_STATE_KILLED}
    assert server.jobs is not None
    assert {server.jobs.get_job(j).state for j in jobs} <= {JobState.KILLING, JobState.KILLED}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s.ClearField("objective"), "objective.metric"),
        (lambda s: s.space["lr"].log_uniform.__setattr__("low", -1.0), "space.lr.low"),
        (lambda s: s.trial.task.__setattr__("command", ""), "trial.task.command"),
        (lambda s: s.__setattr__("algorithm", "nope"), "algorithm"),
    ],
)
def test_a_bad_sweep_is_refused_naming_the_field(
    stub: sweep_pb2_grpc.SweepServiceStub, change: object, field: str
) -> None:
    spec = sweep_spec()
    change(spec)  # type: ignore[operator]
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitSweep(S.SubmitSweepRequest(spec=spec), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(err.value.details()).startswith(f"{field}: ")


def test_unknown_sweep_is_not_found(stub: sweep_pb2_grpc.SweepServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.GetSweep(S.GetSweepRequest(sweep_id="nope"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_sweep_goes_on_after_a_restart(db_url: str, tmp_path: Path) -> None:
    with (
        in_process_server(db_url, tmp_path / "one") as server,
        grpc.insecure_channel(address(server.grpc_port)) as channel,
    ):
        stub = sweep_pb2_grpc.SweepServiceStub(channel)
        sweep = stub.SubmitSweep(S.SubmitSweepRequest(spec=sweep_spec()), timeout=10).sweep
        before = started(stub, sweep.sweep_id, 3)
        report(1, {"loss": 0.2}, env=env_of(server, before[0].job_id))
    with (
        in_process_server(db_url, tmp_path / "two", pools=()) as server,
        grpc.insecure_channel(address(server.grpc_port)) as channel,
    ):
        stub = sweep_pb2_grpc.SweepServiceStub(channel)
        after = trials(stub, sweep.sweep_id)
        assert [(t.index, t.job_id) for t in sorted(after, key=lambda t: t.index)] == [
            (t.index, t.job_id) for t in before
        ]
        assert after[0].best == pytest.approx(0.2)
        # This daemon listens elsewhere (a real one restarts on its configured port).
        here = {"SWEEP_SERVER": address(server.grpc_port)}
        report(1, {"loss": 0.9}, env=env_of(server, before[1].job_id) | here)
        report(1, {"loss": 0.8}, env=env_of(server, before[2].job_id) | here)
        wait_for(
            lambda: state_of(stub, sweep.sweep_id, 1) == "TRIAL_STATE_STOPPED",
            15,
            "the new daemon stops trial 1",
        )


def test_a_sweep_fails_after_max_failed_trials_and_kills_the_rest(
    server: Server, stub: sweep_pb2_grpc.SweepServiceStub
) -> None:
    spec = sweep_spec(max_failed_trials=1)
    spec.ClearField("early_stopping")
    sweep = stub.SubmitSweep(S.SubmitSweepRequest(spec=spec), timeout=10).sweep
    first, *rest = started(stub, sweep.sweep_id, 3)
    report(2, {"loss": float("inf")}, env=env_of(server, first.job_id))

    def state() -> S.Sweep:
        return stub.GetSweep(S.GetSweepRequest(sweep_id=sweep.sweep_id), timeout=10).sweep

    ended = wait_for(
        lambda: s if (s := state()).state == S.SWEEP_STATE_FAILED else None,
        15,
        "the sweep FAILED",
        state=state,
    )
    assert ended.reason == "failed trials reached max_failed_trials (1 of 1)"
    assert dict(ended.trials) == {"failed": 1, "killed": 2}
    assert server.jobs is not None
    jobs = server.jobs
    # Recorded first, then the jobs are killed.
    wait_for(
        lambda: all(
            jobs.get_job(t.job_id).state in (JobState.KILLING, JobState.KILLED) for t in rest
        ),
        15,
        "the other trials' jobs killed",
        state=lambda: [jobs.get_job(t.job_id).state for t in rest],
    )


def test_spare_gpus_grow_the_leading_elastic_trial_and_a_restart_keeps_it_grown(
    db_url: str, tmp_path: Path
) -> None:
    spec = sweep_spec(max_trials=2, parallel_trials=2, budget_gpus=3.0)
    spec.ClearField("early_stopping")
    spec.trial.instances = 0
    spec.trial.gang.max_instances = 3
    with (
        in_process_server(db_url, tmp_path / "one") as server,
        grpc.insecure_channel(address(server.grpc_port)) as channel,
    ):
        stub = sweep_pb2_grpc.SweepServiceStub(channel)
        sweep = stub.SubmitSweep(S.SubmitSweepRequest(spec=spec), timeout=10).sweep
        weak, lead = started(stub, sweep.sweep_id, 2)
        assert server.jobs is not None and server.sweeps is not None
        jobs, sweeps = server.jobs, server.sweeps
        # Each starts at its minimum: the resource manager grows neither.
        assert [sweeps.growth_limit(jobs.get_job(t.job_id)) for t in (weak, lead)] == [1, 1]
        report(1, {"loss": 0.9}, env=env_of(server, weak.job_id))
        report(1, {"loss": 0.1}, env=env_of(server, lead.job_id))
        # 3 GPUs, 2 held: the leader takes the spare one.
        wait_for(
            lambda: sweeps.growth_limit(jobs.get_job(lead.job_id)) == 2,
            15,
            "the leader grown",
            state=lambda: trials(stub, sweep.sweep_id),
        )
        assert sweeps.growth_limit(jobs.get_job(weak.job_id)) == 1
        got = stub.GetSweep(S.GetSweepRequest(sweep_id=sweep.sweep_id), timeout=10).sweep
        assert got.reallocations == 1
    with in_process_server(db_url, tmp_path / "two", pools=()) as server:
        assert server.jobs is not None and server.sweeps is not None
        jobs, sweeps = server.jobs, server.sweeps
        wait_for(
            lambda: sweeps.growth_limit(jobs.get_job(lead.job_id)) == 2,
            15,
            "the new daemon's controller keeps the leader grown",
        )
