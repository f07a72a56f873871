"""Elastic gangs in the scheduler: the spec, admission at the minimum and growth, shrinking
before whole-gang preemption, a lost task shrinking the gang, the gang finishing, and each new
generation recorded and explained (the runtime's side is in test_rendezvous_ops.py, the whole
thing with real processes in test_elastic_e2e.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from resmgr_support import Harness
from support import make_spec

from peloton.api.convert import job_pb
from peloton.collective.rendezvous import RendezvousClient
from peloton.core import gangenv
from peloton.core import spec as specs
from peloton.core.records import TaskUpdate
from peloton.core.resources import Resources
from peloton.core.states import Goal, JobState, TaskState, derive_job_state
from peloton.elastic.endpoints import Endpoints, describe
from peloton.errors import InvalidArgument
from peloton.jobmgr import restarts
from peloton.jobmgr.events import EventBus
from peloton.resmgr import preemption
from peloton.resmgr.admission import Waiting
from peloton.storage.db import Database

T = TaskState
GPU = Resources(gpu=1)


@pytest.fixture
def h(db: Database) -> Iterator[Harness]:
    yield Harness(db, Resources(cpu=10_000, mem_mb=1e9, disk_mb=1e9, gpu=8))


# ---------------------------------------------------------------------------- the spec


def elastic_spec(least: int = 2, most: int = 6, **gang: int) -> specs.job_pb2.JobSpec:
    spec = make_spec(0)
    spec.gang.min_instances, spec.gang.max_instances = least, most
    for k, v in gang.items():
        setattr(spec.gang, k, v)
    return specs.with_defaults(spec)


def test_an_elastic_gang_takes_instances_from_its_maximum_and_has_defaults() -> None:
    spec = elastic_spec(0, 6)
    specs.validate_job_spec(spec)
    assert (spec.instances, spec.gang.min_instances, spec.gang.elastic_timeout_seconds) == (
        6,
        1,
        60,
    )
    assert specs.is_elastic(spec) and specs.is_gang(spec)
    assert not specs.is_elastic(specs.with_defaults(make_spec(3)))


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (lambda s: setattr(s, "instances", 5), "gang.max_instances", "instances is 5"),
        (lambda s: setattr(s.gang, "min_instances", 7), "gang.min_instances", "more than gang.max"),
        (
            lambda s: setattr(s.gang, "elastic_timeout_seconds", 3601),
            "gang.elastic_timeout",
            "3600",
        ),
    ],
)
def test_bad_elastic_fields_are_invalid_arguments_naming_them(
    change: object, field: str, words: str
) -> None:
    spec = elastic_spec()
    change(spec)  # type: ignore[operator]
    with pytest.raises(InvalidArgument) as err:
        specs.validate_job_spec(spec)
    assert err.value.field.startswith(field) and words in str(err.value)


def test_an_elastic_timeout_without_an_elastic_gang_is_refused() -> None:
    spec = specs.with_defaults(make_spec(2))
    spec.gang.elastic_timeout_seconds = 10
    with pytest.raises(InvalidArgument, match="applies only to elastic gangs"):
        specs.validate_job_spec(spec)


def test_the_readme_elastic_gang_spec_is_valid() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("### Elastic gangs", 1)[1]
    text = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = specs.with_defaults(specs.load_job_spec_yaml(text))
    specs.validate_job_spec(spec)
    assert (spec.instances, spec.gang.min_instances, spec.gang.max_instances) == (6, 2, 6)


# ---------------------------------------------------------------------------- pure rules


def test_a_failure_that_leaves_the_minimum_running_shrinks_the_gang() -> None:
    spec = elastic_spec(2, 6)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    failure = [restarts.Failure(5, T.FAILED, "failed", "exit 1")]
    plan = restarts.plan(spec, 0, failure, {5: 1}, now, running=2)
    assert plan.action is restarts.Action.SHRINK and plan.restart == (5,)
    assert "goes on with 2 tasks" in plan.message
    below = restarts.plan(spec, 0, failure, {5: 1}, now, running=1)
    assert below.action is restarts.Action.RESTART_GANG


def test_an_elastic_gang_that_finished_succeeded_whatever_it_lost_on_the_way() -> None:
    counts = {T.SUCCEEDED: 2, T.FAILED: 1, T.KILLED: 3}
    assert derive_job_state(counts, Goal.RUN, elastic=True) is JobState.SUCCEEDED
    assert derive_job_state(counts, Goal.RUN) is JobState.FAILED
    assert derive_job_state(counts, Goal.KILL, elastic=True) is JobState.KILLED


def running(
    key: str, priority: int, gpus: int, spare: int = 0, at: float = 0
) -> preemption.Running:
    return preemption.Running(key, "/p", priority, True, at, 0, GPU.scale(gpus), GPU, spare)


def waiting(gpus: int) -> Waiting:
    return Waiting("new", 10, True, 0.0, 0, gpus, GPU.scale(gpus))


def test_preemption_shrinks_elastic_gangs_before_taking_a_whole_gang() -> None:
    fixed = running("fixed", 0, 2, at=5)  # youngest, lowest priority: first victim otherwise
    elastic = running("elastic", 1, 6, spare=4)
    victims = preemption.by_priority(waiting(3), "/p", GPU.scale(3), [fixed, elastic])
    assert [(v.gang.key, v.tasks) for v in victims] == [("elastic", 3)]


def test_a_shrink_that_is_not_enough_is_followed_by_whole_gangs() -> None:
    fixed = running("fixed", 0, 2)
    elastic = running("elastic", 1, 4, spare=2)
    victims = preemption.by_priority(waiting(4), "/p", GPU.scale(4), [fixed, elastic])
    assert [(v.gang.key, v.tasks) for v in victims] == [("elastic", 2), ("fixed", 0)]


@given(
    spares=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    need=st.integers(1, 12),
)
def test_shrinks_take_no_more_than_needed_and_never_below_the_minimum(
    spares: list[int], need: int
) -> None:
    gangs = [running(f"j{i}", 0, 2 + s, spare=s, at=i) for i, s in enumerate(spares)]
    victims = preemption.by_priority(waiting(need), "/p", GPU.scale(need), gangs)
    freed = sum(v.tasks or int(v.gang.total.gpu) for v in victims)
    if victims:
        assert freed >= need
        shrunk = [v for v in victims if v.tasks]
        assert all(v.tasks <= v.gang.spare for v in shrunk)
        # Whole gangs are taken only once every spare task is (a gang shrunk and then taken
        # whole counts once, whole): a shrink would have done.
        whole = {v.gang.key for v in victims if not v.tasks}
        if whole:
            by_key = {v.gang.key: v.tasks for v in shrunk}
            for g in gangs:
                if g.spare and g.key not in whole:
                    assert by_key.get(g.key) == g.spare
        else:
            assert freed - max(v.tasks for v in shrunk) < need
    else:
        assert sum(2 + s for s in spares) < need


def test_resize_messages_say_how_and_why() -> None:
    assert describe(0, 2, "generation 1") == "started with 2 ranks (generation 1)"
    assert describe(6, 8, "capacity freed") == "resized 6 -> 8 (capacity freed)"
    assert describe(8, 6, "preempted: x") == "shrunk 8 -> 6 (preempted: x)"


# ---------------------------------------------------------------------------- the scheduler


def _run(h: Harness) -> list[str]:
    h.cycle()
    return h.place_all()


def test_an_elastic_gang_starts_at_its_minimum_and_grows_into_freed_capacity(h: Harness) -> None:
    other = h.submit("/default", 5, min_instances=5, name="other")
    _run(h)
    job_id = h.submit("/default", 6, min_instances=2, elastic=True, name="elastic")
    _run(h)
    # 3 GPUs free: the minimum (2) starts at once, and the gang grows into the third.
    assert h.counts(job_id) == {"RUNNING": 3, "PENDING": 3}
    h.finish(other)
    _run(h)
    assert h.counts(job_id) == {"RUNNING": 6}
    assert all(t.current.attempt == 1 for t in h.tasks(job_id))


def test_a_higher_priority_gang_shrinks_the_elastic_gang_instead_of_preempting_it(
    h: Harness,
) -> None:
    job_id = h.submit("/default", 8, min_instances=2, elastic=True, name="elastic")
    _run(h)
    assert h.counts(job_id) == {"RUNNING": 8}
    urgent = h.submit("/default", 2, min_instances=2, priority=5, name="urgent")
    h.cycle(2)  # a gang preempts only after it waited a whole cycle
    assert [(p.job_id, p.tasks) for p in h.preemptions] == [(job_id, 2)]
    # The highest instances are stopped (within the grace); the first ranks run on.
    ids, grace = h.killer.calls[-1]
    assert sorted(ids) == [f"{job_id}-6-1", f"{job_id}-7-1"] and grace == 5
    h.complete_kills()
    assert _run(h) == [urgent]
    counts = h.counts(job_id)
    assert counts == {"RUNNING": 6, "PENDING": 2}
    assert h.job(job_id).state is JobState.RUNNING


def test_a_lost_task_shrinks_the_gang_and_its_slot_rejoins_later(h: Harness) -> None:
    job_id = h.submit("/default", 4, min_instances=2, elastic=True, backoff_seconds=0)
    _run(h)
    h.jobs.update_tasks(job_id, [TaskUpdate(3, 1, T.LOST, "agent_lost", "host went away")])
    assert h.counts(job_id) == {"RUNNING": 3, "PENDING": 1}
    assert h.killer.calls == []  # nobody else is stopped
    assert h.job(job_id).gang_failures == 0
    _run(h)
    assert h.counts(job_id) == {"RUNNING": 4}
    assert {t.instance_id: t.current.attempt for t in h.tasks(job_id)} == {0: 1, 1: 1, 2: 1, 3: 2}


def test_below_its_minimum_the_elastic_gang_fails_whole(h: Harness) -> None:
    job_id = h.submit("/default", 3, min_instances=3, elastic=True, max_failures=0)
    _run(h)
    h.jobs.update_tasks(job_id, [TaskUpdate(1, 1, T.FAILED, "failed", "exit status 3")])
    ids, _ = h.killer.calls[-1]
    assert sorted(ids) == [f"{job_id}-0-1", f"{job_id}-2-1"]
    assert "the gang failed 1 times" in h.job(job_id).message


def test_the_gang_finishes_when_a_rank_succeeds_and_waiting_slots_are_killed(h: Harness) -> None:
    other = h.submit("/default", 6, min_instances=6, name="other")
    _run(h)
    job_id = h.submit("/default", 6, min_instances=2, elastic=True)
    _run(h)
    assert h.counts(job_id) == {"RUNNING": 2, "PENDING": 4}
    h.finish(job_id)
    job = h.job(job_id)
    assert job.state is JobState.SUCCEEDED, job
    assert h.counts(job_id) == {"SUCCEEDED": 2, "KILLED": 4}
    assert h.job(other).state is JobState.RUNNING


def test_generations_are_recorded_once_in_order_and_shown_by_get_job(h: Harness) -> None:
    job_id = h.submit("/default", 4, min_instances=2, elastic=True)
    h.jobs.record_generation(job_id, 2, 4, "resized 2 -> 4 (capacity freed)")
    h.jobs.record_generation(job_id, 1, 2, "started with 2 ranks (generation 1)")  # late
    job = h.job(job_id)
    assert (job.generation, job.gang_size) == (2, 4)
    status = job_pb(job).elastic
    assert (status.min_instances, status.max_instances, status.size, status.generation) == (
        2,
        4,
        4,
        2,
    )
    events = [e for e in h.jobs.job_events(job_id) if e.reason == "resized"]
    assert [e.message for e in events] == ["resized 2 -> 4 (capacity freed)"]
    assert not job_pb(h.job(h.submit("/default", 2))).HasField("elastic")


# ---------------------------------------------------------------------------- the endpoints


def test_the_endpoint_records_each_generation_and_why_it_shrank(h: Harness) -> None:
    job_id = h.submit("/default", 3, min_instances=2, elastic=True, name="elastic")
    _run(h)
    spec = h.job(job_id).spec
    endpoints = Endpoints(h.jobs, h.jobs.events, "127.0.0.1")
    bus: EventBus = h.jobs.events
    bus.subscribe(endpoints.job_changed)
    try:
        env = endpoints.task_env(job_id, spec)
        assert env[gangenv.ELASTIC_TIMEOUT] == "60"
        assert endpoints.task_env(job_id, spec) == env  # one endpoint per job
        workers = [
            RendezvousClient(
                env[gangenv.RENDEZVOUS], env[gangenv.RENDEZVOUS_TOKEN], f"{job_id}-{i}-1", 10
            )
            for i in range(3)
        ]
        joined = _join_all(workers)
        assert sorted(m.rank for m in joined) == [0, 1, 2]
        _await_generation(h, bus, job_id, 1)
        # The scheduler takes instance 2 back: the generation closes and the rest re-form.
        h.jobs.preempt(job_id, "job urgent of priority 5 needs gpu 1", count=1)
        endpoints.drain(job_id, [f"{job_id}-2-1"], "preempted")
        assert workers[0].watch(joined[0].generation, 10)
        _join_all(workers[:2])
        _await_generation(h, bus, job_id, 2)
        job = h.job(job_id)
        assert job.gang_size == 2
        messages = [e.message for e in h.jobs.job_events(job_id) if e.reason == "resized"]
        assert messages == [
            "started with 3 ranks (generation 1)",
            "shrunk 3 -> 2 (preempted: job urgent of priority 5 needs gpu 1)",
        ]
        assert endpoints.sizes() == {job_id: 2}
        samples = endpoints.metrics.registry.get_sample_value
        assert samples("peloton_elastic_resizes_total", {"cause": "preempted"}) == 1
        assert samples("peloton_elastic_gang_size", {"job_id": job_id}) == 2
        # The job ends: its endpoint closes.
        h.jobs.kill_job(job_id)
        h.complete_kills()
        _await(lambda: job_id not in endpoints.addresses(), "the ended job's endpoint closing")
        for w in workers:
            w.close()
    finally:
        endpoints.close()


def _join_all(workers: list[RendezvousClient]) -> list:  # type: ignore[type-arg]
    out: list = [None] * len(workers)  # type: ignore[type-arg]

    def one(i: int) -> None:
        out[i] = workers[i].join(f"127.0.0.1:{40000 + i}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
        assert not t.is_alive(), "a worker still waiting to join after 20 s"
    return out


def _await_generation(h: Harness, bus: EventBus, job_id: str, generation: int) -> None:
    _await(lambda: h.job(job_id).generation >= generation, f"generation {generation}", bus)


def _await(done: object, what: str, bus: EventBus | None = None) -> None:
    import time

    deadline = time.monotonic() + 20
    event = threading.Event()
    while not done():  # type: ignore[operator]
        left = deadline - time.monotonic()
        assert left > 0, f"timed out after 20 s waiting for {what}"
        if bus is not None:
            bus.wait(bus.generation(), min(left, 0.5))
        else:
            event.wait(0.05)


def test_job_get_and_watch_show_the_gang_and_its_resizes() -> None:
    from peloton.cli.output import elastic_lines, event_line, instances_line
    from peloton.v1 import job_pb2

    job = job_pb2.Job(spec=elastic_spec(2, 6))
    assert instances_line(job) == "2 to 6 (elastic gang)"
    assert elastic_lines(job) == []  # not elastic as far as the answer goes: no status
    job.elastic.CopyFrom(job_pb2.ElasticStatus(min_instances=2, max_instances=6))
    assert elastic_lines(job) == [("Elastic", "not formed yet (min 2, max 6)")]
    job.elastic.size, job.elastic.generation = 4, 3
    assert elastic_lines(job) == [("Elastic", "4 ranks, generation 3 (min 2, max 6)")]
    event = job_pb2.JobEvent(
        from_state="RUNNING",
        to_state="RUNNING",
        reason="resized",
        message="resized 2 -> 6 (capacity freed)",
    )
    assert event_line(event).endswith("job        resized 2 -> 6 (capacity freed)")


def test_growth_never_delays_a_waiting_gang_of_the_same_priority(h: Harness) -> None:
    other = h.submit("/default", 6, min_instances=6, name="other")
    _run(h)
    job_id = h.submit("/default", 6, min_instances=2, elastic=True, name="elastic")
    later = h.submit("/default", 4, min_instances=4, name="later")
    _run(h)
    assert h.counts(job_id) == {"RUNNING": 2, "PENDING": 4}
    h.finish(other)
    _run(h)
    # 6 GPUs free: the later gang, submitted after the elastic one, starts; growth takes the
    # rest, and the remainder once the later gang ends.
    assert h.counts(later) == {"RUNNING": 4}
    assert h.counts(job_id) == {"RUNNING": 4, "PENDING": 2}
    h.finish(later)
    _run(h)
    assert h.counts(job_id) == {"RUNNING": 6}
