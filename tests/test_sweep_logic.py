"""The sweep package's pure logic: search space, built-in search, early stopping, the
reallocation decision and the sweep spec's checks (no daemon, no database)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.errors import InvalidArgument
from peloton.sweep import spec as sweep_spec
from peloton.sweep.realloc import Running, plan_growth
from peloton.sweep.search import GridSearch, RandomSearch
from peloton.sweep.space import Choice, IntRange, LogUniform, Uniform, axis, check_space, sample
from peloton.sweep.stopping import Asha, MedianStopping, value_at
from peloton.sweep.trialjob import trial_job
from peloton.v1 import common_pb2, job_pb2, sweep_pb2

SPACE = {
    "lr": LogUniform(1e-4, 1.0),
    "momentum": Uniform(0.0, 0.99),
    "layers": IntRange(1, 4),
    "opt": Choice(("sgd", "adam")),
}


def test_samples_stay_in_their_ranges_and_repeat_with_the_seed() -> None:
    for i in range(200):
        point = sample(SPACE, random.Random(i))
        assert 1e-4 <= float(point["lr"]) <= 1.0
        assert 0.0 <= float(point["momentum"]) <= 0.99
        assert point["layers"] in (1, 2, 3, 4)
        assert point["opt"] in ("sgd", "adam")
    search = RandomSearch(SPACE, seed=7)
    again = RandomSearch(SPACE, seed=7)
    assert [search.suggest(i) for i in range(5)] == [again.suggest(i) for i in range(5)]
    assert search.suggest(0) != RandomSearch(SPACE, seed=8).suggest(0)


def test_grid_takes_every_point_once_then_none() -> None:
    grid = GridSearch({"lr": LogUniform(0.01, 1.0), "opt": Choice(("sgd", "adam"))}, points=3)
    points = [grid.suggest(i) for i in range(len(grid))]
    assert len(grid) == 6 and grid.suggest(6) is None
    lrs = sorted({float(p.params["lr"]) for p in points if p is not None})
    assert lrs == pytest.approx([0.01, 0.1, 1.0])
    assert list(axis(IntRange(1, 3), 5)) == [1, 2, 3]


@pytest.mark.parametrize(
    ("space", "field"),
    [
        ({}, "space"),
        ({"lr": Uniform(1.0, 0.1)}, "space.lr.low"),
        ({"lr": LogUniform(0.0, 1.0)}, "space.lr.low"),
        ({"lr": Uniform(0.0, math.inf)}, "space.lr.low"),
        ({"opt": Choice(())}, "space.opt.values"),
        ({"bad-name": Uniform(0, 1)}, "space.bad-name"),
    ],
)
def test_a_malformed_space_is_refused_naming_the_field(space: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_space(space)
    assert err.value.field == field


histories = st.dictionaries(
    st.sampled_from([f"t{i}" for i in range(12)]),
    st.lists(
        st.tuples(st.integers(0, 100), st.floats(-10, 10, allow_nan=False)),
        min_size=0,
        max_size=12,
    ).map(lambda xs: sorted({s: v for s, v in xs}.items())),
    min_size=1,
)


@given(histories, st.integers(2, 4))
@settings(max_examples=200, deadline=None)
def test_asha_keeps_only_the_best_one_eta_th_at_each_rung(h: dict, eta: int) -> None:
    asha = Asha(min_step=1, max_step=81, eta=eta)
    for rung in asha.rungs():
        there = {
            t: value_at(x, rung)
            for t, x in h.items()
            if x and x[-1][0] >= rung and value_at(x, rung) is not None
        }
        kept = asha.keeps(rung, h)
        assert len(kept) <= max(1, len(there) // eta)
        # Nobody kept is worse than anyone not kept.
        if kept and there.keys() - kept:
            assert max(there[t] for t in kept) <= min(there[t] for t in there.keys() - kept)
    for trial in h:
        why = asha.stop(trial, h)
        rung = asha.rung_of(h[trial])
        assert (why != "") == (rung is not None and trial not in asha.keeps(rung, h))


def test_asha_stops_the_weak_trials_at_the_first_rung() -> None:
    asha = Asha(min_step=2, max_step=20, eta=3)
    assert asha.rungs() == [2, 6, 18]
    h = {"a": [(2, 0.1)], "b": [(2, 0.5)], "c": [(2, 0.9)], "d": [(1, 0.0)]}
    assert asha.stop("a", h) == ""
    assert asha.stop("b", h).startswith("ASHA: not in the best 1 of 3 trials at rung step 2")
    assert asha.stop("c", h) != ""
    assert asha.stop("d", h) == ""  # not at the first rung yet


def test_median_rule_stops_a_trial_worse_than_the_others_median() -> None:
    rule = MedianStopping(grace_steps=2, min_trials=3)
    h = {
        "a": [(1, 1.0), (3, 0.5)],
        "b": [(1, 1.0), (3, 0.6)],
        "c": [(1, 1.0), (3, 0.7)],
        "bad": [(1, 2.0), (3, 1.5)],
        "early": [(1, 9.0)],
    }
    assert rule.stop("bad", h).startswith("median rule: best 1.5 at step 3")
    assert rule.stop("a", h) == ""
    assert rule.stop("early", h) == ""  # still in its grace steps


running = st.lists(
    st.builds(
        Running,
        trial=st.text("abcdef", min_size=1, max_size=3),
        size=st.integers(1, 4),
        max_size=st.integers(1, 8),
        gpus_per_task=st.sampled_from([0.5, 1.0, 2.0]),
        loss=st.one_of(st.none(), st.floats(-5, 5, allow_nan=False)),
    ),
    max_size=8,
    unique_by=lambda r: r.trial,
)


@given(running, st.floats(0, 20))
@settings(max_examples=300, deadline=None)
def test_growth_never_exceeds_the_budget_or_a_gang_maximum(trials: list, free: float) -> None:
    grows = plan_growth(trials, free)
    by_id = {t.trial: t for t in trials}
    spent = sum((size - by_id[t].size) * by_id[t].gpus_per_task for t, size in grows.items())
    assert spent <= free + 1e-9
    for t, size in grows.items():
        assert by_id[t].size < size <= by_id[t].max_size
        assert by_id[t].loss is not None
    # A trial grows only if every better one that could grow reached its maximum first.
    for t in grows:
        for better in trials:
            if (
                better.loss is not None
                and better.loss < by_id[t].loss
                and better.max_size > better.size
                and better.gpus_per_task <= by_id[t].gpus_per_task
            ):
                assert grows.get(better.trial) == better.max_size


def test_the_leader_grows_first() -> None:
    trials = [Running("weak", 1, 4, 1.0, 0.9), Running("lead", 1, 4, 1.0, 0.1)]
    assert plan_growth(trials, 4) == {"lead": 4, "weak": 2}
    assert plan_growth(trials, 2) == {"lead": 3}


def _spec(**over: object) -> sweep_pb2.SweepSpec:
    spec = sweep_pb2.SweepSpec(
        name="s",
        trial=job_pb2.JobSpec(
            pool="/research",
            gang=job_pb2.GangSpec(min_instances=1, max_instances=4),
            task=job_pb2.TaskSpec(
                command="train --lr {lr}", resources=common_pb2.Resources(cpu=1, mem_mb=64, gpu=1)
            ),
        ),
        objective=sweep_pb2.Objective(metric="loss"),
        max_trials=12,
        parallel_trials=4,
    )
    spec.space["lr"].log_uniform.low = 0.001
    spec.space["lr"].log_uniform.high = 1.0
    for key, value in over.items():
        setattr(spec, key, value)
    return spec


def test_a_sweep_spec_becomes_a_plan() -> None:
    plan = sweep_spec.plan(_spec(budget_gpus=8.0))
    assert (plan.min_size, plan.max_size, plan.gpus_per_task, plan.budget_gpus) == (1, 4, 1.0, 8.0)
    assert sweep_spec.plan(_spec()).budget_gpus == 4.0  # parallel_trials at the minimum


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"name": ""}, "name"),
        ({"algorithm": "hyperband"}, "algorithm"),
        ({"max_trials": 0}, "max_trials"),
        ({"parallel_trials": 13}, "parallel_trials"),
        ({"budget_gpus": 0.5}, "budget_gpus"),
    ],
)
def test_a_malformed_sweep_spec_is_refused_naming_the_field(over: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        sweep_spec.plan(_spec(**over))
    assert err.value.field == field


def test_asha_fields_are_checked() -> None:
    spec = _spec()
    spec.early_stopping.asha.min_step = 10
    spec.early_stopping.asha.max_step = 5
    with pytest.raises(InvalidArgument) as err:
        sweep_spec.plan(spec)
    assert err.value.field == "early_stopping.asha.max_step"


def test_a_trial_job_carries_its_parameters_and_report_token() -> None:
    job = trial_job(_spec().trial, "s", "sid", 3, {"lr": 0.01}, "tok", "10.0.0.1:5392")
    assert job.name == "s-trial-3"
    assert job.task.command == "train --lr 0.01"
    assert job.task.env["SWEEP_PARAM_LR"] == "0.01"
    assert job.task.env["SWEEP_TOKEN"] == "tok"
    assert job.task.env["SWEEP_SERVER"] == "10.0.0.1:5392"
    assert dict(job.labels) == {"sweep": "sid", "trial": "3"}
    assert "SWEEP_SERVER_TLS" not in job.task.env
    tls = trial_job(_spec().trial, "s", "sid", 3, {"lr": 0.01}, "tok", "10.0.0.1:5392", tls=True)
    assert tls.task.env["SWEEP_SERVER_TLS"] == "1"  # the daemon serves TLS: report over it
