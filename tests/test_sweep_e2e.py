"""Sweeps end to end: a ``peloton server`` process on PostgreSQL, a minicluster whose agents
run real processes, and the README's sweep example (examples/sweep/lr-sweep.yaml: 12 trials of
a deterministic trainer whose best region is known) submitted with the CLI. The sweep finds a
trial in the best region, ASHA stops weak trials early (fewer steps than running every trial to
its end), spare GPUs grow the leading elastic trials, and a daemon SIGKILLed mid-sweep loses no
trial and no reported step. An Optuna-backed (TPE) sweep runs too."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import (
    ROOT,
    Peloton,
    free_port,
    run_peloton,
    scrape_metrics,
    start_minicluster,
    wait_for,
)
from sqlalchemy import text

from peloton.minicluster import AgentSpec, Minicluster
from peloton.storage.db import make_engine
from peloton.sweep.yamlspec import load_sweep_spec_yaml
from peloton.v1 import pool_pb2, sweep_pb2

pytestmark = pytest.mark.parametrize("backend", ["postgresql"])

EXAMPLE = ROOT / "examples" / "sweep" / "lr-sweep.yaml"
AGENT = "cpus:8;mem:16384;disk:10000;gpus:4;ports:[31000-31100]"
STEPS = 27  # the trainer's, to the end
DONE = (sweep_pb2.SWEEP_STATE_SUCCEEDED, sweep_pb2.SWEEP_STATE_FAILED, sweep_pb2.SWEEP_STATE_KILLED)


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Minicluster]:
    # The agents pass their environment on to tasks, as after `. .venv/bin/activate`.
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent), prepend=":")
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    agents = [AgentSpec(f"agent-{i}", resources=AGENT) for i in range(2)]
    mc = start_minicluster(agents, tmp_path / "cluster")
    yield mc
    mc.stop()


@pytest.fixture
def peloton(db_url: str, cluster: Minicluster, tmp_path: Path) -> Iterator[Peloton]:
    # A fixed port: the trials' tasks report to it, and find it again after a restart.
    p = Peloton(db_url, cluster, tmp_path / "peloton", ["--grpc-port", str(free_port())])
    for path in ("/research", "/research/vision"):
        p.client.create_pool(pool_pb2.PoolSpec(path=path))
    yield p
    p.close()


def sweep_of(p: Peloton, sweep_id: str) -> sweep_pb2.Sweep:
    return p.client.get_sweep(sweep_id)


def wait_done(p: Peloton, sweep_id: str, timeout: float = 240) -> sweep_pb2.Sweep:
    return wait_for(
        lambda: s if (s := sweep_of(p, sweep_id)).state in DONE else None,
        timeout,
        f"sweep {sweep_id} to end",
        interval=0.5,
        state=lambda: p.client.list_trials(sweep_id),
    )


def test_the_example_sweep_finds_the_best_region_stops_early_and_survives_a_sigkill(
    peloton: Peloton,
) -> None:
    submitted = run_peloton("sweep", "submit", "-q", str(EXAMPLE), server=peloton.proc.address)
    assert submitted.returncode == 0, submitted.stderr
    sweep_id = submitted.stdout.strip()
    # Mid-sweep: some trial stopped early, some still to start.
    wait_for(
        lambda: sweep_of(peloton, sweep_id).trials.get("stopped", 0) >= 1,
        120,
        "a trial stopped early",
        interval=0.2,
        state=lambda: peloton.client.list_trials(sweep_id),
    )
    before = {t.index: t.job_id for t in peloton.client.list_trials(sweep_id)}
    peloton.restart_after_sigkill()
    sweep = wait_done(peloton, sweep_id)
    trials = peloton.client.list_trials(sweep_id)
    assert sweep.state == sweep_pb2.SWEEP_STATE_SUCCEEDED, sweep.reason
    # No trial lost or made twice across the restart. A trial may have been stored before the
    # SIGKILL and its job not yet (its job_id empty then): the daemon after the restart makes it,
    # under the trial's request id, so a job the first daemon made is found, not made again.
    assert len(trials) == 12
    after = {t.index: t.job_id for t in trials}
    assert before.keys() <= after.keys(), (before, after)
    assert {i: after[i] for i in before if before[i]} == {i: j for i, j in before.items() if j}
    assert all(after.values()), after
    jobs = peloton.client.list_jobs(page_size=100)
    assert not jobs.next_page_token
    assert sorted(j.job_id for j in jobs.jobs) == sorted(after.values()), (jobs, after)
    states = [sweep_pb2.TrialState.Name(t.state) for t in trials]
    assert "TRIAL_STATE_FAILED" not in states, [(t.index, t.reason) for t in trials]
    # The best trial is in the known best region.
    best = trials[0]
    assert best.index == sweep.best_trial
    assert 0.03 <= float(best.params["lr"]) <= 0.3, best
    assert sweep.reason.startswith(f"best trial {best.index}: loss 0.1")
    # ASHA stopped the weak ones early, with the rule's reason: fewer steps than all to the end.
    stopped = [t for t in trials if t.state == sweep_pb2.TRIAL_STATE_STOPPED]
    assert stopped and all(t.reason.startswith("ASHA: not in the best ") for t in stopped)
    assert all(t.last_step < STEPS for t in stopped)
    assert sweep.total_steps < 12 * STEPS
    # Every step of every trial that ran to its end was stored, the SIGKILL notwithstanding.
    for t in trials:
        if t.state == sweep_pb2.TRIAL_STATE_SUCCEEDED:
            assert t.last_step == STEPS, t
    # Spare GPUs grew the leading elastic trials.
    assert sweep.reallocations >= 1
    assert max(t.size for t in trials) == 2
    grown = [
        task.current.host
        for t in trials
        if t.size == 2
        for task in peloton.client.list_tasks(t.job_id).tasks
        if task.instance_id == 1
    ]
    assert any(grown), "no grown trial's second task was ever placed"
    # The CLI shows the same, best first.
    shown = run_peloton("sweep", "trials", sweep_id, "-o", "json", server=peloton.proc.address)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["trials"][0]["index"] == best.index
    metrics = scrape_metrics(peloton.proc.metrics_port)
    assert metrics[("peloton_sweep_trials", (("state", "STOPPED"),))] == len(stopped)
    print(
        f"sweep: {len(stopped)} of 12 trials stopped early; {sweep.total_steps} steps reported "
        f"of {12 * STEPS} to run all to the end; {sweep.reallocations} reallocations"
    )


def test_an_optuna_tpe_sweep_runs(peloton: Peloton, db_url: str) -> None:
    spec = load_sweep_spec_yaml(EXAMPLE.read_text())
    spec.name = "lr-tpe"
    spec.algorithm = "tpe"
    spec.max_trials = 4
    spec.parallel_trials = 2
    spec.ClearField("early_stopping")
    sweep_id = peloton.client.submit_sweep(spec).sweep_id
    sweep = wait_done(peloton, sweep_id)
    assert sweep.state == sweep_pb2.SWEEP_STATE_SUCCEEDED, sweep.reason
    assert sweep.trials["succeeded"] == 4
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            told = conn.execute(
                text(
                    "SELECT count(*) FROM trials JOIN studies USING (study_id) "
                    "WHERE study_name = :name AND trials.state = 'COMPLETE'"
                ),
                {"name": f"peloton-sweep-{sweep_id}"},
            ).scalar()
    finally:
        engine.dispose()
    assert told == 4
