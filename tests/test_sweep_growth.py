"""The resource manager's growth policy, which a sweep uses to grow only its leading elastic
trials (README "Sweeps", "GPUs follow results"): an elastic gang grows no further than the
policy says, and grows on as soon as the policy allows more and the job is looked at again."""

from __future__ import annotations

from resmgr_support import Harness

from peloton.core.records import JobRecord
from peloton.core.resources import Resources


def _run(h: Harness, cycles: int = 3) -> None:
    for _ in range(cycles):
        h.cycle()
        h.place_all()


def test_an_elastic_gang_grows_only_as_far_as_the_growth_policy_allows() -> None:
    h = Harness.in_memory(Resources(cpu=10_000, mem_mb=1e9, disk_mb=1e9, gpu=8))
    limits: dict[str, int] = {}

    def policy(job: JobRecord) -> int | None:
        return limits.get(job.id)

    h.rm.set_growth_policy(policy)
    held = h.submit("/default", 6, min_instances=2, elastic=True, name="held")
    limits[held] = 2
    h.rm.job_changed(held)
    free = h.submit("/default", 3, min_instances=1, elastic=True, name="free")
    _run(h)
    # 8 GPUs: the held gang stays at its limit, the other grows to its maximum.
    assert h.counts(held) == {"RUNNING": 2, "PENDING": 4}
    assert h.counts(free) == {"RUNNING": 3}
    limits[held] = 4
    h.rm.job_changed(held)
    _run(h)
    assert h.counts(held) == {"RUNNING": 4, "PENDING": 2}
    # No limit: it takes what is left (8 GPUs, 3 held by the other).
    del limits[held]
    h.rm.job_changed(held)
    _run(h)
    assert h.counts(held) == {"RUNNING": 5, "PENDING": 1}
