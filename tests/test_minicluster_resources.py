"""Pure parts of the minicluster: resource arithmetic, agent specs, RecordIO, launch validation."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peloton.minicluster import AgentSpec
from peloton.minicluster.recordio import Decoder, encode
from peloton.minicluster.resources import (
    ResourceSet,
    from_json,
    mesos_text,
    normalize_ranges,
    parse_text,
    ranges_contain,
    subtract_ranges,
)
from peloton.minicluster.spec import parse_attributes
from peloton.minicluster.validation import Invalid, plan_group

ranges_st = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 8)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=6,
)
amount_st = st.integers(0, 100_000).map(lambda n: n / 1000)
sets_st = st.builds(
    lambda cpus, mem, gpus, ports, reserved: ResourceSet.of(
        {"cpus": cpus, "mem": mem, "gpus": float(gpus)},
        {"ports": ports},
        {role: ResourceSet.of({"cpus": c, "gpus": float(g)}) for role, (c, g) in reserved.items()},
    ),
    amount_st,
    amount_st,
    st.integers(0, 8),
    ranges_st,
    st.dictionaries(st.sampled_from(["gpu", "eng"]), st.tuples(amount_st, st.integers(0, 4))),
)


def _values(ranges: Any) -> set[int]:
    return {v for b, e in ranges for v in range(b, e + 1)}


@given(ranges_st)
def test_normalized_ranges_are_sorted_disjoint_and_hold_the_same_values(ranges: Any) -> None:
    out = normalize_ranges(ranges)
    assert _values(out) == _values(ranges)
    for (_, e1), (b2, _) in itertools.pairwise(out):
        assert e1 + 1 < b2  # neither overlapping nor adjacent


@given(ranges_st, ranges_st)
def test_range_subtraction_and_containment_match_sets(a: Any, b: Any) -> None:
    na, nb = normalize_ranges(a), normalize_ranges(b)
    assert _values(subtract_ranges(na, nb)) == _values(na) - _values(nb)
    assert ranges_contain(na, nb) == (_values(nb) <= _values(na))


@given(sets_st, sets_st)
def test_adding_then_subtracting_gets_back(a: ResourceSet, b: ResourceSet) -> None:
    both = a + b
    assert both.contains(a)
    if not _values(a.ranges.get("ports", ())) & _values(b.ranges.get("ports", ())):
        assert both - b == a
    assert a - a == ResourceSet()
    assert (a + ResourceSet()) is a


@given(sets_st)
def test_text_and_json_forms_round_trip(a: ResourceSet) -> None:
    if not a.is_empty():
        assert parse_text(str(a)) == a
    assert from_json(a.to_json("role")) == a
    assert from_json(a.to_json("role", refinement=True)) == a


def test_reservations_are_kept_apart() -> None:
    agent = parse_text("gpus(gpu):2;cpus(gpu):4;cpus(eng):1;cpus:4;mem:8192;ports:[1-2]")
    assert agent.scalar("cpus") == 9 and agent.unreserved() == parse_text(
        "cpus:4;mem:8192;ports:[1-2]"
    )
    assert agent.for_role("gpu") == parse_text(
        "gpus(gpu):2;cpus(gpu):4;cpus:4;mem:8192;ports:[1-2]"
    )
    assert agent.for_role("*") == agent.unreserved()
    # Reserved cpus do not hold unreserved ones, nor another role's.
    assert not parse_text("cpus(gpu):8").contains(parse_text("cpus:1"))
    assert not parse_text("cpus(gpu):8").contains(parse_text("cpus(eng):1"))
    assert parse_text("cpus(*):2") == parse_text("cpus:2")
    with pytest.raises(ValueError, match="cannot subtract"):
        parse_text("cpus(gpu):8") - parse_text("cpus:1")
    # As /master/state shows an agent: totals, and the reservations by role.
    assert agent.to_state()["cpus"] == 9
    assert agent.reserved_state() == {"eng": {"cpus": 1}, "gpu": {"cpus": 4, "gpus": 2}}


def test_resources_print_as_a_mesos_master_prints_them() -> None:
    offer = parse_text("gpus(gpu):2;cpus:4;ports:[31000-31004,31006-32000]").to_json("gpu")
    assert mesos_text(offer, "gpu") == (
        "gpus(allocated: gpu)(reservations: [(STATIC,gpu)]):2; "
        "ports(allocated: gpu):[31000-31004, 31006-32000]; cpus(allocated: gpu):4"
    )
    # Equal kinds merge in order; allocation_info given wins over the offer's role.
    asked = [
        {"name": "cpus", "type": "SCALAR", "scalar": {"value": 1}, "role": "gpu"},
        {"name": "mem", "type": "SCALAR", "scalar": {"value": 64}},
        {"name": "mem", "type": "SCALAR", "scalar": {"value": 32}},
        {
            "name": "cpus",
            "type": "SCALAR",
            "scalar": {"value": 0.1},
            "allocation_info": {"role": "x"},
        },
    ]
    assert mesos_text(asked, "gpu") == (
        "cpus(allocated: gpu)(reservations: [(STATIC,gpu)]):1; mem(allocated: gpu):96; "
        "cpus(allocated: x):0.1"
    )
    assert mesos_text([], "gpu") == "{}"


def test_subtracting_more_than_there_is_is_a_bug() -> None:
    with pytest.raises(ValueError, match="cannot subtract"):
        parse_text("cpus:1") - parse_text("cpus:2")
    with pytest.raises(ValueError, match="cannot subtract"):
        parse_text("ports:[1-5]") - parse_text("ports:[5-6]")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("cpus", "expected NAME:VALUE"),
        ("cpus:many", "'many' is not a number"),
        ("cpus:-1", "non-negative"),
        ("gpus:1.5", "whole number"),
        ("ports:[10-5]", "ends before it begins"),
        ("ports:[10-]", "bad range"),
        ("ports:[1-2", "unterminated"),
    ],
)
def test_bad_resource_text_names_the_item(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_text(text)


def test_bad_resource_json_names_the_entry() -> None:
    with pytest.raises(ValueError, match=r"resources\[1\] \(mem\): SCALAR"):
        from_json([{"name": "cpus", "scalar": {"value": 1}}, {"name": "mem", "type": "SCALAR"}])
    with pytest.raises(ValueError, match="type 'SET' is not supported"):
        from_json([{"name": "x", "type": "SET", "set": {"item": ["a"]}}])


def test_agent_specs() -> None:
    agents = AgentSpec.uniform(3, "cpus:2;mem:10", "rack:r1;gen:3")
    assert [a.hostname for a in agents] == ["agent-0", "agent-1", "agent-2"]
    assert agents[0].total() == ResourceSet.of({"cpus": 2, "mem": 10})
    assert parse_attributes("rack:r1;gen:3") == {"rack": "r1", "gen": 3.0}
    named = AgentSpec.uniform(2, hostnames=["gpu-a", "gpu-b"])
    assert [a.hostname for a in named] == ["gpu-a", "gpu-b"]
    # Agents may share a machine, hence a hostname.
    assert [a.hostname for a in AgentSpec.uniform(2, hostnames=["x", "x"])] == ["x", "x"]
    with pytest.raises(ValueError, match="need 2 hostnames"):
        AgentSpec.uniform(2, hostnames=["x"])
    with pytest.raises(ValueError, match="attribute 'rack': expected NAME:VALUE"):
        AgentSpec("h", "cpus:1", "rack")
    with pytest.raises(ValueError, match="agent hostname 'h h': must be non-empty, no spaces"):
        AgentSpec("h h")


def test_agents_file(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(
        "agents:\n"
        "  - hostname: a\n    resources: 'cpus:1;mem:2;disk:3'\n    attributes: 'rack:x'\n"
        "  - hostname: b\n    resources: {cpus: 4, mem: 8, ports: [[1, 3]]}\n"
    )
    a, b = AgentSpec.load_file(path)
    assert a.attribute_map() == {"rack": "x"}
    assert b.total() == ResourceSet.of({"cpus": 4, "mem": 8}, {"ports": [(1, 3)]})
    path.write_text("- {hostname: a}\n- {hostname: a, resources: 'gpus(gpu):2;cpus:1'}\n")
    same, reserved = AgentSpec.load_file(path)
    assert same.hostname == reserved.hostname == "a"
    assert reserved.total() == ResourceSet.of(
        {"cpus": 1}, None, {"gpu": ResourceSet.of({"gpus": 2})}
    )
    with pytest.raises(ValueError, match="cannot read agents file"):
        AgentSpec.load_file(tmp_path / "missing.yaml")


@given(st.lists(st.binary(max_size=40), max_size=5), st.lists(st.integers(1, 30), max_size=10))
def test_recordio_decodes_whatever_the_splits(records: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode(r) for r in records)
    decoder, out, pos = Decoder(), [], 0
    for cut in [*cuts, len(stream)]:
        out += decoder.feed(stream[pos : pos + cut])
        pos += cut
    out += decoder.feed(stream[pos:])
    assert out == records


def _group(executor_res: list[dict[str, Any]], tasks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "executor": {
            "type": "DEFAULT",
            "executor_id": {"value": "e"},
            "framework_id": {"value": "f"},
            "resources": executor_res,
        },
        "task_group": {"tasks": tasks},
    }


def _task(task_id: str, text: str) -> dict[str, Any]:
    return {
        "name": task_id,
        "task_id": {"value": task_id},
        "agent_id": {"value": "a"},
        "resources": parse_text(text).to_json(),
        "command": {"value": "true"},
    }


EXEC = parse_text("cpus:0.1;mem:32;disk:10").to_json()


def test_group_plan_counts_the_executor_once() -> None:
    offer = parse_text("cpus:1.1;mem:96;disk:10;ports:[1-2]")
    plan = plan_group(
        _group(EXEC, [_task("t1", "cpus:0.5;mem:32;ports:[1-1]"), _task("t2", "cpus:0.5;mem:32")]),
        "f",
        "a",
        offer,
        lambda t: False,
        lambda e: False,
    )
    assert [p.task_id for p in plan.tasks] == ["t1", "t2"]
    assert plan.executor_resources == parse_text("cpus:0.1;mem:32;disk:10")
    # A running executor already holds its resources: a second group needs only the tasks'.
    again = plan_group(
        _group([], [_task("t3", "cpus:1;mem:96")]), "f", "a", offer, lambda t: False, lambda e: True
    )
    assert again.executor_resources.is_empty()


@pytest.mark.parametrize(
    ("executor", "tasks", "in_use", "error"),
    [
        (EXEC[:2], [_task("t", "cpus:0.1")], set(), "Executor 'e' uses no disk"),
        (EXEC, [], set(), "at least one task"),
        (EXEC, [_task("t", "cpus:0.1")], {"t"}, "duplicate ID: t"),
        (
            EXEC,
            [_task("t", "cpus:5")],
            set(),
            "Total resources cpus(allocated: *):5.1; mem(allocated: *):32; disk(allocated: *):10"
            " required by task group and its executor are more than available"
            " cpus(allocated: *):1; mem(allocated: *):100; disk(allocated: *):100",
        ),
        (
            EXEC,
            [dict(_task("t", "cpus:0.1"), agent_id={"value": "b"})],
            set(),
            "Task 't' is invalid: Task uses invalid agent b while agent a is expected",
        ),
        (EXEC, [dict(_task("t", "cpus:0.1"), executor={})], set(), "must not set 'executor'"),
    ],
)
def test_invalid_groups(
    executor: list[dict[str, Any]], tasks: list[dict[str, Any]], in_use: set[str], error: str
) -> None:
    with pytest.raises(Invalid, match=re.escape(error)):
        plan_group(
            _group(executor, tasks),
            "f",
            "a",
            parse_text("cpus:1;mem:100;disk:100"),
            lambda t: t in in_use,
            lambda e: False,
        )


_JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=2)
        | st.dictionaries(
            st.sampled_from(
                [
                    *("value", "name", "shell", "arguments", "environment", "variables"),
                    *("volumes", "mesos", "image", "type"),
                ]
            ),
            inner,
            max_size=3,
        )
    ),
    max_leaves=6,
)
_TASK_KEYS = [
    "name",
    "task_id",
    "agent_id",
    "resources",
    "command",
    "executor",
    "kill_policy",
    "container",
]


@given(
    tasks=st.lists(
        st.dictionaries(st.sampled_from(_TASK_KEYS), _JUNK, max_size=6)
        | st.builds(lambda cmd: dict(_task("t", "cpus:0.1"), command=cmd), _JUNK),
        max_size=3,
    )
)
def test_validation_rejects_junk_with_invalid_never_a_crash(tasks: list[Any]) -> None:
    from peloton.minicluster.agent import command_env
    from peloton.minicluster.containers import launch_command

    try:
        plan = plan_group(
            _group(EXEC, tasks),
            "f",
            "a",
            parse_text("cpus:1;mem:100;disk:100"),
            lambda t: False,
            lambda e: False,
        )
    except Invalid as exc:
        assert str(exc)
        return
    for p in plan.tasks:  # what passed can be run
        launch_command(p.info.get("command") or {}, None)
        command_env(p.info)
