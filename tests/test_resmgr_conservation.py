"""Work conservation: a gang that can't be admitted claims nothing, idle capacity goes to a queued
gang that fits it, and what pools lend never exceeds what exists. By example through a resource
manager over a real database, and by property over the pure cycle (entitlements, admission)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from resmgr_support import Harness

from peloton.api.pool_service import pool_pb
from peloton.core.pools import ROOT, KindConfig, Policy, PoolConfig, QueuePolicy
from peloton.core.resources import EPSILON, ZERO, Resources
from peloton.resmgr import admission
from peloton.resmgr.admission import Decision, Room, Waiting
from peloton.resmgr.conservation import Conserved, conserve
from peloton.resmgr.entitlement import Calculator
from peloton.resmgr.pool import PoolTree
from peloton.storage.db import Database

TOL = 1e-6
# Two agents of 8 cpu, 32 GiB and 4 GPUs: `peloton minicluster up --agents 2` (issue 13).
TWO_AGENTS = Resources(cpu=16, mem_mb=65536, disk_mb=200_000, gpu=8)


def kinds(**settings_: tuple[float, float, float, Policy]) -> dict[str, KindConfig]:
    return {k: KindConfig(*v) for k, v in settings_.items()}


INF, E, S = math.inf, Policy.ELASTIC, Policy.STATIC
# The pool tree of examples/pools/ as issue 13 found it.
EXAMPLE_POOLS = [
    PoolConfig("/research", kinds=kinds(gpu=(8, 64, 1, E), cpu=(64, 512, 1, E))),
    PoolConfig("/research/vision", kinds=kinds(gpu=(4, 32, 2, E), cpu=(32, 256, 2, E))),
    PoolConfig("/research/nlp", kinds=kinds(gpu=(4, 16, 1, S), cpu=(32, INF, 1, E))),
    PoolConfig("/llm", kinds=kinds(gpu=(8, 64, 1, E), cpu=(64, 512, 1, E))),
]


@pytest.fixture
def two_agents(db: Database) -> Iterator[Harness]:
    h = Harness(db, TWO_AGENTS)
    for config in EXAMPLE_POOLS:
        h.rm.create_pool(config)
    yield h


def test_a_gang_that_can_never_fit_its_share_does_not_starve_another_pool(
    two_agents: Harness,
) -> None:
    """The idle cluster of issue 13: an 8-GPU sweep that /research/vision can't be entitled to
    (/research/nlp's 4 GPUs are static) claimed its 16 cpus as demand, so /research/nlp was
    entitled to 3.2 cpus and its one 4-cpu job waited too, with all 16 cpus idle."""
    h = two_agents
    sweep = h.submit("/research/vision", 8, cpu=2, mem_mb=8192, name="sweep", priority=-10)
    single = h.submit("/research/nlp", 1, cpu=4, mem_mb=16384, name="single", preemptible=False)
    h.cycle()
    assert h.counts(single) == {"READY": 1}, h.job(single).message
    assert h.counts(sweep) == {"PENDING": 8}
    job = h.job(sweep)
    assert job.reason == admission.PENDING_ENTITLEMENT
    assert job.message.startswith("pool /research/vision: gpu entitlement ")
    assert job.message.endswith("gang needs 8")
    # The sweep's demand is still shown; its claim is not.
    vision = h.rm.status("/research/vision").kinds
    assert vision["gpu"].demand == 8 and vision["gpu"].entitlement < 8
    assert h.rm.status("/research/nlp").kinds["cpu"].entitlement >= 4
    vision_status = h.rm.status("/research/vision")
    assert vision_status.oversized_gangs == 1
    assert pool_pb(h.rm.pool_tree(), vision_status).oversized_gangs == 1  # GetPool's answer
    gauge = h.rm.metrics.registry.get_sample_value(
        "peloton_pool_queue_oversized_gangs", {"pool": "/research/vision"}
    )
    assert gauge == 1


def test_pools_lend_no_more_than_the_cluster_has(two_agents: Harness) -> None:
    h = two_agents
    h.cycle()
    statuses = h.rm.statuses()
    for kind in ("cpu", "gpu"):
        capacity = TWO_AGENTS.get(kind)
        # /research and /llm each reserve 64 cpus on a 16-cpu cluster: each guarantees 8.
        assert sum(statuses[p].kinds[kind].lent for p in ("/research", "/llm")) <= capacity
        for path, status in statuses.items():
            assert status.kinds[kind].lent <= capacity, (path, kind)
    assert statuses["/research"].kinds["cpu"].lent == 8
    assert statuses["/research/nlp"].kinds["gpu"].lent == 0  # static: never lent


def test_two_gangs_bigger_than_their_share_do_not_leave_the_cluster_idle(db: Database) -> None:
    """Each of two equal pools is entitled to 4 of 8 GPUs and queues a 6-GPU gang: counting
    neither would leave all 8 idle; the older one runs, then the other."""
    h = Harness(db, Resources(cpu=100, mem_mb=1e6, disk_mb=1e6, gpu=8))
    h.pool("/a")
    h.pool("/b")
    first = h.submit("/a", 6, min_instances=6)
    second = h.submit("/b", 6, min_instances=6)
    h.cycle()
    assert h.counts(first) == {"READY": 6}
    assert h.counts(second) == {"PENDING": 6}
    h.place_all()
    h.finish(first)
    h.cycle()
    assert h.counts(second) == {"READY": 6}


def test_a_gang_its_pool_is_entitled_to_still_holds_what_it_waits_for(db: Database) -> None:
    """Reserve-ahead survives: a gang that fits its pool's entitlement but not the free capacity
    (another pool borrowed it) counts as demand, so the borrower's next gangs don't take it."""
    h = Harness(db, Resources(cpu=100, mem_mb=1e6, disk_mb=1e6, gpu=8))
    h.pool("/owner", 8)
    h.pool("/borrower")
    early = h.submit("/borrower", 6, min_instances=6)
    h.cycle()
    h.place_all()
    owner = h.submit("/owner", 4, min_instances=4)
    late = h.submit("/borrower", 2, min_instances=2)
    h.cycle()
    assert h.counts(owner) == {"PENDING": 4}
    assert h.counts(late) == {"PENDING": 2}  # the 2 free GPUs are the owner's
    assert h.rm.status("/owner").kinds["gpu"].entitlement == 4
    assert h.counts(early) == {"RUNNING": 6}


# ---------------------------------------------------------------- the property


@dataclass(frozen=True)
class Case:
    pools: tuple[PoolConfig, ...]  # shown when a property fails
    capacity: Resources
    allocation: Mapping[str, Resources]
    np_allocation: Mapping[str, Resources]
    queues: Mapping[str, Sequence[Waiting]]

    @property
    def tree(self) -> PoolTree:
        return PoolTree(self.pools)


KIND_NAMES = ("cpu", "gpu")


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A valid two-level pool tree in cpu and gpu, a cluster, what each leaf holds (within the
    cluster and its limits) and each leaf's queue."""
    capacity = Resources(
        cpu=draw(st.integers(0, 32)), mem_mb=1e9, disk_mb=1e9, gpu=draw(st.integers(0, 16))
    )
    pools: list[PoolConfig] = []
    for i in range(draw(st.integers(1, 3))):
        n_kids = draw(st.integers(0, 3))
        parent: dict[str, KindConfig] = {}
        child: list[dict[str, KindConfig]] = [{} for _ in range(n_kids)]
        for k in KIND_NAMES:
            limit = draw(st.sampled_from([math.inf, 8, 16, 24]))
            res = [draw(st.integers(0, 6)) for _ in range(n_kids)]
            reservation = min(limit, sum(res) + draw(st.integers(0, 6)))
            while sum(res) > reservation:
                res[res.index(max(res))] -= 1
            parent[k] = KindConfig(
                reservation,
                limit,
                draw(st.sampled_from([1, 2])),
                draw(st.sampled_from([E, E, S])),
            )
            for j, r in enumerate(res):
                climit = max(min(draw(st.sampled_from([math.inf, 4, 8, 16])), limit), r)
                policy = draw(st.sampled_from([E, E, E, S]))
                child[j][k] = KindConfig(r, climit, draw(st.sampled_from([1, 2, 3])), policy)
        pools.append(PoolConfig(f"/p{i}", kinds=parent))
        policy = draw(st.sampled_from(list(QueuePolicy)))
        pools += [
            PoolConfig(f"/p{i}/c{j}", kinds=child[j], queue_policy=policy) for j in range(n_kids)
        ]
    tree = PoolTree(pools)
    allocation: dict[str, Resources] = {}
    np_allocation: dict[str, Resources] = {}
    queues: dict[str, list[Waiting]] = {}
    left = capacity
    seq = 0
    for leaf in sorted(tree.leaves()):
        held = Resources(cpu=draw(st.integers(0, 8)), gpu=draw(st.integers(0, 4)))
        headroom = Resources.of({k: _headroom(tree, leaf, k, allocation) for k in KIND_NAMES})
        held = Resources.of({k: min(held.get(k), left.get(k), headroom.get(k)) for k in KIND_NAMES})
        allocation[leaf], left = held, left - held
        np_allocation[leaf] = held if draw(st.booleans()) else ZERO
        queue = []
        for _ in range(draw(st.integers(0, 4))):
            seq += 1
            size = draw(st.integers(1, 4))
            per_task = Resources(cpu=draw(st.integers(0, 4)), gpu=draw(st.integers(0, 2)))
            if per_task.is_zero():
                per_task = Resources(cpu=1)
            queue.append(
                Waiting(
                    key=f"j{seq}",
                    priority=draw(st.integers(-1, 1)),
                    preemptible=draw(st.booleans()),
                    submitted_at=float(draw(st.integers(0, 100))),
                    seq=seq,
                    size=size,
                    total=per_task.scale(size),
                )
            )
        queues[leaf] = admission.order(queue, tree.get(leaf).queue_policy)
    return Case(tuple(pools), capacity, allocation, np_allocation, queues)


def _headroom(tree: PoolTree, leaf: str, kind: str, allocation: Mapping[str, Resources]) -> float:
    """How much more ``leaf`` may hold of ``kind`` before it or an ancestor passes its limit."""
    room = math.inf
    node = leaf
    while node != ROOT:
        held = sum(
            a.get(kind) for p, a in allocation.items() if p == node or p.startswith(node + "/")
        )
        room = min(room, tree.get(node).kind(kind).limit - held)
        node = node.rsplit("/", 1)[0] or ROOT
    return max(0.0, room)


@dataclass(frozen=True)
class Cycle:
    conserved: Conserved
    decisions: dict[str, Decision]
    free: Resources
    allocation: dict[str, Resources]
    np_allocation: dict[str, Resources]


def run(case: Case) -> Cycle:
    """One cycle as the resource manager runs it: feasible queues, conserved entitlements,
    admission into every pool."""
    free = case.capacity - sum(case.allocation.values(), ZERO)
    demand = {
        p: case.allocation[p] + sum((g.total for g in q), ZERO) for p, q in case.queues.items()
    }

    def room(pool: str, entitlement: Resources) -> Room:
        return Room.of(
            case.tree, pool, entitlement, case.allocation[pool], case.np_allocation[pool]
        )

    rooms = {p: room(p, ZERO) for p in case.queues}
    conserved = conserve(Calculator(case.tree), case.capacity, demand, case.queues, rooms, free)
    rooms = {p: room(p, conserved.usable.entitlement[p]) for p in case.queues}
    decisions, free = admission.admit_all(case.queues, rooms, free, case.capacity)
    allocation, np_allocation = dict(case.allocation), dict(case.np_allocation)
    for pool, decision in decisions.items():
        for gang in decision.admitted:
            allocation[pool] = allocation[pool] + gang.total
            if not gang.preemptible:
                np_allocation[pool] = np_allocation[pool] + gang.total
    return Cycle(conserved, decisions, free, allocation, np_allocation)


def _fits_kinds_it_uses(need: Resources, available: Resources) -> bool:
    return all(need.get(k) <= EPSILON or need.get(k) <= available.get(k) + TOL for k in KIND_NAMES)


@settings(max_examples=500, deadline=None)
@given(cases())
def test_no_admissible_gang_waits_while_the_cluster_has_room_for_it(case: Case) -> None:
    """After a cycle, a queued gang that fits the cluster's free capacity, its pool's limits and
    (non-preemptible) its reservation waits only if a higher-ranked gang holds what it needs: a
    gang ahead of it in its pool's queue that fits the pool's entitlement (reserve-ahead) and
    needs a kind it needs, a gang another pool is entitled to, or a STATIC reservation, which
    never lends."""
    cycle = run(case)
    ents = cycle.conserved.usable.entitlement
    waiting = {
        pool: [g for g in case.queues[pool] if g.key in d.pending]
        for pool, d in cycle.decisions.items()
    }
    idle = _static_idle(case.tree, ents, cycle)
    static_idle = sum(idle.values(), ZERO)
    holding = {
        p: sum((g.total for g in gs if g.total.fits_in(ents[p])), ZERO) for p, gs in waiting.items()
    }
    for pool, gangs in waiting.items():
        held_elsewhere = sum((h for p, h in holding.items() if p != pool), ZERO)
        # What other pools' waiting gangs hold and idle static reservations count against
        # their ancestors' limits as if used.
        occupied = {
            p: cycle.allocation.get(p, ZERO)
            + idle.get(p, ZERO)
            + (holding.get(p, ZERO) if p != pool else ZERO)
            for p in {*idle, *cycle.allocation}
        }
        queue = list(case.queues[pool])
        for gang in gangs:
            ahead = queue[: queue.index(gang)]
            behind_a_holder = any(
                h in gangs and h.total.fits_in(ents[pool]) and _shares_a_kind(h.total, gang.total)
                for h in ahead
            )
            limit_room = Resources.of(
                {k: _headroom(case.tree, pool, k, occupied) for k in KIND_NAMES}
            )
            reservation = Room.of(case.tree, pool, ZERO, ZERO, ZERO).reservation
            within_rules = gang.total.fits_in(limit_room) and (
                gang.preemptible or gang.total.fits_in(reservation - cycle.np_allocation[pool])
            )
            room_for_it = _fits_kinds_it_uses(gang.total, cycle.free - held_elsewhere - static_idle)
            assert behind_a_holder or not (within_rules and room_for_it), (
                f"{gang.key} in {pool} waits ({cycle.decisions[pool].pending[gang.key]}) with "
                f"free {cycle.free}, held elsewhere {held_elsewhere}, static idle {static_idle}; "
                f"{_explain(case, cycle)}"
            )


def _explain(case: Case, cycle: Cycle) -> str:
    """Each leaf's queue, allocation and entitlements, for a failing property."""

    def amount(r: Resources) -> str:
        return f"cpu {r.cpu:g} gpu {r.gpu:g}"

    lines = []
    for leaf, queue in case.queues.items():
        fair = cycle.conserved.fair.entitlement[leaf]
        usable = cycle.conserved.usable.entitlement[leaf]
        gangs = ", ".join(
            f"{g.key}({amount(g.total)}{'' if g.preemptible else ' np'})" for g in queue
        )
        left_out = [g.key for g in cycle.conserved.left_out.get(leaf, ())]
        decision = cycle.decisions[leaf]
        lines.append(
            f"{leaf}: alloc {amount(case.allocation[leaf])}, fair {amount(fair)}, "
            f"usable {amount(usable)}, queue [{gangs}], left out {left_out}, "
            f"admitted {[g.key for g in decision.admitted]}, pending {decision.pending}, "
            f"infeasible {list(decision.infeasible)}"
        )
    return f"capacity {amount(case.capacity)}\n" + "\n".join(lines)


def _static_idle(
    tree: PoolTree, ents: Mapping[str, Resources], cycle: Cycle
) -> dict[str, Resources]:
    """What each STATIC reservation keeps idle: entitled, not used in the pool's subtree, never
    lent outside it (a STATIC pool inside another counted once, with the outer one)."""
    idle: dict[str, dict[str, float]] = {}
    for k in KIND_NAMES:
        stack = list(tree.children(ROOT))
        while stack:
            path = stack.pop()
            if tree.get(path).kind(k).policy is S:
                used = sum(
                    a.get(k)
                    for p, a in cycle.allocation.items()
                    if p == path or p.startswith(path + "/")
                )
                idle.setdefault(path, {})[k] = max(0.0, ents[path].get(k) - used)
            else:
                stack.extend(tree.children(path))
    return {path: Resources.of(kinds) for path, kinds in idle.items()}


def _shares_a_kind(a: Resources, b: Resources) -> bool:
    return any(a.get(k) > EPSILON and b.get(k) > EPSILON for k in KIND_NAMES)


@settings(max_examples=300, deadline=None)
@given(cases())
def test_lending_never_exceeds_what_exists(case: Case) -> None:
    """What reservations guarantee (and so what pools lend) sums, under every parent, to no more
    than the parent's guarantee; the root's is the cluster."""
    guaranteed = Calculator(case.tree).guarantees(case.capacity)
    for path, _ in case.tree.walk():
        kids = case.tree.children(path)
        for k in KIND_NAMES:
            assert guaranteed[path].get(k) <= case.capacity.get(k) + TOL
            if kids:
                assert sum(guaranteed[c].get(k) for c in kids) <= guaranteed[path].get(k) + TOL
            if path != ROOT:
                assert guaranteed[path].get(k) <= case.tree.get(path).kind(k).reservation + TOL


@settings(max_examples=300, deadline=None)
@given(cases())
def test_admission_stays_within_usable_entitlements_and_the_cluster(case: Case) -> None:
    cycle = run(case)
    ents = cycle.conserved.usable.entitlement
    assert all(cycle.free.get(k) >= -TOL for k in KIND_NAMES) or not any(
        d.admitted for d in cycle.decisions.values()
    )
    for pool, decision in cycle.decisions.items():
        if decision.admitted:
            assert _fits_kinds_it_uses(
                sum((g.total for g in decision.admitted), ZERO), ents[pool] - case.allocation[pool]
            )


def test_a_sweep_left_out_names_its_pool_and_kind() -> None:
    """The pure form of the idle-cluster case: the sweep is left out, the single job counted."""
    tree = PoolTree(EXAMPLE_POOLS)
    sweep = Waiting("sweep", -10, True, 0.0, 1, 8, Resources(cpu=16, mem_mb=65536, gpu=8))
    single = Waiting("single", 0, False, 1.0, 2, 1, Resources(cpu=4, mem_mb=16384, gpu=1))
    queues = {"/research/vision": [sweep], "/research/nlp": [single]}
    demand = {p: sum((g.total for g in q), ZERO) for p, q in queues.items()}
    rooms = {p: Room.of(tree, p, ZERO, ZERO, ZERO) for p in queues}
    conserved = conserve(Calculator(tree), TWO_AGENTS, demand, queues, rooms, TWO_AGENTS)
    assert dict(conserved.left_out) == {"/research/vision": (sweep,)}
    assert conserved.fair.entitlement["/research/nlp"].cpu == pytest.approx(3.2)
    assert conserved.usable.entitlement["/research/nlp"].cpu >= 4
    assert single.total.fits_in(conserved.usable.entitlement["/research/nlp"])
