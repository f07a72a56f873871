"""Job spec loading, defaults and validation (peloton.core.spec)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from peloton.core import spec as specs
from peloton.core.spec import (
    DEFAULT_BACKOFF_SECONDS,
    DEFAULT_KILL_GRACE_SECONDS,
    DEFAULT_MAX_FAILURES,
    DEFAULT_POOL,
    MAX_COMMAND,
    MAX_ENV_VALUE,
    MAX_INSTANCES,
    MAX_LABEL_VALUE,
    MAX_NAME,
    load_job_spec_yaml,
    validate_job_spec,
    with_defaults,
)
from peloton.errors import InvalidArgument
from peloton.v1 import job_pb2

EXAMPLE_YAML = """\
name: resnet-cifar
pool: /research/vision
priority: 10
labels: {team: vision}
instances: 4
gang: {min_instances: 4}
task:
  command: python train.py --epochs 10
  env: {LOG_LEVEL: info}
  resources: {cpu: 4, mem_mb: 16384, disk_mb: 10240, gpu: 1}
  constraints: [{attribute: gpu_model, op: in, values: [A100, H100]}]
  ports: [rendezvous]
restart: {max_failures: 3, backoff_seconds: 30}
preemption: {preemptible: true, kill_grace_seconds: 30}
max_runtime_seconds: 86400
"""

EXAMPLE: dict[str, Any] = yaml.safe_load(EXAMPLE_YAML)

MINIMAL_YAML = """\
name: tiny
instances: 3
task:
  command: echo hi
  resources: {cpu: 0.5, mem_mb: 128}
"""


def check(text: str) -> job_pb2.JobSpec:
    """What CreateJob does with a YAML spec: parse, fill defaults, validate."""
    full = with_defaults(load_job_spec_yaml(text))
    validate_job_spec(full)
    return full


Mutation = Callable[[dict[str, Any]], None]

# A valid leaf constraint, for building any_of cases.
LEAF: dict[str, Any] = {"attribute": "rack", "op": "eq", "values": ["r1"]}


def setting(path: str, value: Any) -> Mutation:
    """Set a dotted path (``task.resources.gpu``) of the example spec."""

    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    mutate.__name__ = f"{path}={value!r}"[:60]
    return mutate


def removing(path: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        del node[last]

    return mutate


def mutated(*mutations: Mutation) -> str:
    data = copy.deepcopy(EXAMPLE)
    for m in mutations:
        m(data)
    return yaml.safe_dump(data, sort_keys=False)


# Each case: (YAML text, the field InvalidArgument must name, a substring of its reason).
BAD_SPECS: list[tuple[str, str, str, str]] = [
    # resources
    (
        "negative-gpu",
        mutated(setting("task.resources.gpu", -1)),
        "task.resources.gpu",
        "must not be negative",
    ),
    (
        "fractional-gpu",
        mutated(setting("task.resources.gpu", 0.5)),
        "task.resources.gpu",
        "whole number of GPUs (got 0.5)",
    ),
    (
        "too-many-gpus",
        mutated(setting("task.resources.gpu", 65)),
        "task.resources.gpu",
        "at most 64",
    ),
    ("zero-cpu", mutated(setting("task.resources.cpu", 0)), "task.resources.cpu", "greater than 0"),
    (
        "negative-cpu",
        mutated(setting("task.resources.cpu", -2)),
        "task.resources.cpu",
        "must not be negative",
    ),
    (
        "nan-cpu-quoted",
        mutated(setting("task.resources.cpu", "NaN")),
        "task.resources.cpu",
        "finite",
    ),
    (
        "inf-cpu-quoted",
        mutated(setting("task.resources.cpu", "Infinity")),
        "task.resources.cpu",
        "finite",
    ),
    (
        "minus-inf-mem-quoted",
        mutated(setting("task.resources.mem_mb", "-Infinity")),
        "task.resources.mem_mb",
        "finite",
    ),
    ("nan-cpu-yaml", EXAMPLE_YAML.replace("cpu: 4,", "cpu: .nan,"), "task.resources.cpu", "NaN"),
    (
        "inf-cpu-yaml",
        EXAMPLE_YAML.replace("cpu: 4,", "cpu: .inf,"),
        "task.resources.cpu",
        "Infinity",
    ),
    (
        "nan-disk-quoted",
        mutated(setting("task.resources.disk_mb", "NaN")),
        "task.resources.disk_mb",
        "finite",
    ),
    (
        "zero-mem",
        mutated(setting("task.resources.mem_mb", 0)),
        "task.resources.mem_mb",
        "greater than 0",
    ),
    (
        "negative-disk",
        mutated(setting("task.resources.disk_mb", -1)),
        "task.resources.disk_mb",
        "must not be negative",
    ),
    ("no-resources", mutated(removing("task.resources")), "task.resources", "is required"),
    ("no-task", mutated(removing("task")), "task", "is required"),
    # instances and gang
    (
        "zero-instances",
        mutated(setting("instances", 0), removing("gang")),
        "instances",
        "at least 1",
    ),
    ("no-instances", mutated(removing("instances"), removing("gang")), "instances", "at least 1"),
    (
        "too-many-instances",
        mutated(setting("instances", MAX_INSTANCES + 1)),
        "instances",
        f"at most {MAX_INSTANCES}",
    ),
    ("negative-instances", mutated(setting("instances", -1)), "instances", "wrong type"),
    (
        "gang-over-instances",
        mutated(setting("gang.min_instances", 5)),
        "gang.min_instances",
        "is 5, more than instances (4)",
    ),
    # constraints
    (
        "unknown-op",
        mutated(
            setting("task.constraints", [{"attribute": "rack", "op": "like", "values": ["a"]}])
        ),
        "task.constraints[0].op",
        "unknown op 'like'",
    ),
    (
        "eq-two-values",
        mutated(
            setting(
                "task.constraints",
                [
                    {"attribute": "rack", "op": "in", "values": ["a"]},
                    {"attribute": "gpu_model", "op": "eq", "values": ["A100", "H100"]},
                ],
            )
        ),
        "task.constraints[1].values",
        "exactly one value",
    ),
    (
        "eq-no-value",
        mutated(setting("task.constraints", [{"attribute": "rack", "op": "eq"}])),
        "task.constraints[0].values",
        "exactly one value",
    ),
    (
        "exists-with-values",
        mutated(
            setting(
                "task.constraints", [{"attribute": "gpu_model", "op": "exists", "values": ["A100"]}]
            )
        ),
        "task.constraints[0].values",
        "takes no values",
    ),
    (
        "in-without-values",
        mutated(setting("task.constraints", [{"attribute": "gpu_model", "op": "not_in"}])),
        "task.constraints[0].values",
        "at least one value",
    ),
    (
        "bad-attribute",
        mutated(setting("task.constraints", [{"attribute": "", "op": "exists"}])),
        "task.constraints[0].attribute",
        "host attribute",
    ),
    (
        "any-of-leaf-bad-op",
        mutated(setting("task.constraints", [LEAF, {"any_of": [{"attribute": "rack"}]}])),
        "task.constraints[1].any_of[0].op",
        "unknown op ''",
    ),
    (
        "any-of-with-attribute",
        mutated(setting("task.constraints", [{"attribute": "rack", "any_of": [LEAF]}])),
        "task.constraints[0].attribute",
        "not allowed beside any_of",
    ),
    (
        "any-of-with-values",
        mutated(setting("task.constraints", [{"values": ["x"], "any_of": [LEAF]}])),
        "task.constraints[0].values",
        "not allowed beside any_of",
    ),
    (
        "any-of-empty",
        mutated(setting("task.constraints", [LEAF, {"any_of": []}])),
        "task.constraints[1]",
        "non-empty any_of",
    ),
    (
        "any-of-too-deep",
        mutated(setting("task.constraints", [{"any_of": [LEAF, {"any_of": [LEAF]}]}])),
        "task.constraints[0].any_of[1].any_of",
        "at most 2 levels deep",
    ),
    (
        "any-of-leaf-eq-two-values",
        mutated(
            setting(
                "task.constraints",
                [{"any_of": [LEAF, {"attribute": "zone", "op": "eq", "values": ["a", "b"]}]}],
            )
        ),
        "task.constraints[0].any_of[1].values",
        "exactly one value",
    ),
    (
        "any-of-unknown-key",
        mutated(setting("task.constraints", [{"any_of": [{"attribute": "rack", "opp": "eq"}]}])),
        "task.constraints[0].any_of[0].opp",
        "did you mean task.constraints[0].any_of[0].op?",
    ),
    (
        "constraints-too-many-with-any-of",
        mutated(setting("task.constraints", [{"any_of": [LEAF] * 16}, {"any_of": [LEAF] * 15}])),
        "task.constraints",
        "at most 32 constraints, those inside any_of included (got 33)",
    ),
    # placement
    (
        "unknown-placement",
        mutated(setting("placement", "scatter")),
        "placement",
        "unknown placement 'scatter'; use pack or spread",
    ),
    # command
    ("empty-command", mutated(setting("task.command", "")), "task.command", "must not be empty"),
    (
        "blank-command",
        mutated(setting("task.command", "  \t\n ")),
        "task.command",
        "must not be empty",
    ),
    ("no-command", mutated(removing("task.command")), "task.command", "must not be empty"),
    (
        "oversize-command",
        mutated(setting("task.command", "x" * (MAX_COMMAND + 1))),
        "task.command",
        f"longer than {MAX_COMMAND}",
    ),
    # unknown keys, with hints
    (
        "unknown-top-key",
        mutated(setting("instnces", 4)),
        "instnces",
        "unknown key (did you mean instances?)",
    ),
    (
        "unknown-nested-key",
        mutated(setting("task.resources.gpus", 1)),
        "task.resources.gpus",
        "unknown key (did you mean task.resources.gpu?)",
    ),
    (
        "unknown-key-in-list",
        mutated(setting("task.constraints", [{"attribute": "rack", "opp": "exists"}])),
        "task.constraints[0].opp",
        "did you mean task.constraints[0].op?",
    ),
    ("unknown-key-no-hint", mutated(setting("zzzzzz", 1)), "zzzzzz", "unknown key"),
    ("unknown-gang-key", mutated(setting("gang.min", 1)), "gang.min", "unknown key"),
    # YAML itself
    ("unreadable-yaml", "name: [unclosed\ninstances: 4\n", "spec", "not valid YAML at line"),
    ("bad-indent-yaml", "name: a\n  instances: 4\n x: 1\n", "spec", "not valid YAML"),
    ("yaml-list", "- name: a\n- instances: 4\n", "spec", "must be a YAML mapping"),
    ("yaml-scalar", "just a string\n", "spec", "must be a YAML mapping"),
    ("yaml-empty", "", "spec", "must be a YAML mapping"),
    # wrong types
    ("instances-string", mutated(setting("instances", "four")), "instances", "wrong type"),
    ("instances-fraction", mutated(setting("instances", 1.5)), "instances", "wrong type"),
    (
        "cpu-string",
        mutated(setting("task.resources.cpu", "lots")),
        "task.resources.cpu",
        "wrong type",
    ),
    ("labels-list", mutated(setting("labels", ["a", "b"])), "labels", "wrong type"),
    ("env-int", mutated(setting("task.env", {"N": 1})), "task.env", "wrong type"),
    ("name-int", mutated(setting("name", 5)), "name", "wrong type"),
    ("ports-string", mutated(setting("task.ports", "rendezvous")), "task.ports", "wrong type"),
    ("task-string", mutated(setting("task", "python train.py")), "task", "wrong type"),
    ("priority-fraction", mutated(setting("priority", 1.5)), "priority", "wrong type"),
    # sizes
    (
        "oversize-name",
        mutated(setting("name", "n" * (MAX_NAME + 1))),
        "name",
        f"longer than {MAX_NAME}",
    ),
    ("bad-name", mutated(setting("name", "has space")), "name", "may hold only"),
    ("no-name", mutated(removing("name")), "name", "is required"),
    (
        "oversize-label-value",
        mutated(setting("labels", {"team": "v" * (MAX_LABEL_VALUE + 1)})),
        "labels.team",
        f"longer than {MAX_LABEL_VALUE}",
    ),
    ("bad-label-key", mutated(setting("labels", {"-team": "x"})), "labels.-team", "key must be"),
    (
        "oversize-label-key",
        mutated(setting("labels", {"k" * 64: "x"})),
        f"labels.{'k' * 64}",
        "key must be",
    ),
    (
        "too-many-labels",
        mutated(setting("labels", {f"k{i}": "v" for i in range(65)})),
        "labels",
        "at most 64",
    ),
    (
        "oversize-env-value",
        mutated(setting("task.env", {"BIG": "v" * (MAX_ENV_VALUE + 1)})),
        "task.env.BIG",
        f"longer than {MAX_ENV_VALUE}",
    ),
    (
        "bad-env-name",
        mutated(setting("task.env", {"1X": "v"})),
        "task.env.1X",
        "not a valid environment variable",
    ),
    (
        "reserved-peloton-env",
        mutated(setting("task.env", {"PELOTON_PORT_X": "1"})),
        "task.env.PELOTON_PORT_X",
        "set by peloton",
    ),
    (
        "reserved-mesos-env",
        mutated(setting("task.env", {"MESOS_TASK_ID": "1"})),
        "task.env.MESOS_TASK_ID",
        "set by peloton",
    ),
    ("priority-too-high", mutated(setting("priority", 1_000_001)), "priority", "between"),
    ("priority-too-low", mutated(setting("priority", -1_000_001)), "priority", "between"),
    # pool
    ("relative-pool", mutated(setting("pool", "research/vision")), "pool", "absolute path"),
    (
        "empty-pool-segment",
        mutated(setting("pool", "/research//vision")),
        "pool",
        "empty or invalid segment ''",
    ),
    (
        "trailing-slash-pool",
        mutated(setting("pool", "/research/")),
        "pool",
        "empty or invalid segment",
    ),
    (
        "bad-pool-segment",
        mutated(setting("pool", "/research/.hidden")),
        "pool",
        "invalid segment '.hidden'",
    ),
    ("oversize-pool", mutated(setting("pool", "/" + "p" * 600)), "pool", "longer than 512"),
    # ports
    (
        "duplicate-ports",
        mutated(setting("task.ports", ["rendezvous", "metrics", "rendezvous"])),
        "task.ports[2]",
        "duplicate port name 'rendezvous'",
    ),
    (
        "upper-case-port",
        mutated(setting("task.ports", ["Rendezvous"])),
        "task.ports[0]",
        "lower-case",
    ),
    (
        "port-with-dash",
        mutated(setting("task.ports", ["ok", "my-port"])),
        "task.ports[1]",
        "lower-case",
    ),
    ("empty-port", mutated(setting("task.ports", [""])), "task.ports[0]", "lower-case"),
    (
        "too-many-ports",
        mutated(setting("task.ports", [f"p{i}" for i in range(17)])),
        "task.ports",
        "at most 16",
    ),
    # policies
    (
        "max-failures-too-large",
        mutated(setting("restart.max_failures", 101)),
        "restart.max_failures",
        "at most 100",
    ),
    (
        "backoff-too-large",
        mutated(setting("restart.backoff_seconds", 86_401)),
        "restart.backoff_seconds",
        "at most 86400",
    ),
    (
        "grace-too-large",
        mutated(setting("preemption.kill_grace_seconds", 3601)),
        "preemption.kill_grace_seconds",
        "at most 3600",
    ),
    (
        "runtime-too-large",
        mutated(setting("max_runtime_seconds", 365 * 86_400 + 1)),
        "max_runtime_seconds",
        "at most",
    ),
]


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [pytest.param(t, f, r, id=i) for i, t, f, r in BAD_SPECS],
)
def test_bad_spec_names_the_field(text: str, field: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        check(text)
    err = info.value
    assert err.field == field, f"{err.field}: {err.reason}"
    assert reason in err.reason
    assert str(err) == f"{field}: {err.reason}"


def test_the_bad_spec_table_ids_are_unique() -> None:
    ids = [case[0] for case in BAD_SPECS]
    assert len(ids) == len(set(ids))


def test_example_spec_is_valid() -> None:
    spec = check(EXAMPLE_YAML)
    assert spec.name == "resnet-cifar"
    assert spec.pool == "/research/vision"
    assert spec.priority == 10
    assert dict(spec.labels) == {"team": "vision"}
    assert spec.instances == 4
    assert spec.gang.min_instances == 4
    assert spec.task.command == "python train.py --epochs 10"
    assert dict(spec.task.env) == {"LOG_LEVEL": "info"}
    r = spec.task.resources
    assert (r.cpu, r.mem_mb, r.disk_mb, r.gpu) == (4, 16384, 10240, 1)
    [c] = spec.task.constraints
    assert (c.attribute, c.op, list(c.values)) == ("gpu_model", "in", ["A100", "H100"])
    assert list(spec.task.ports) == ["rendezvous"]
    assert (spec.restart.max_failures, spec.restart.backoff_seconds) == (3, 30)
    assert spec.preemption.preemptible is True
    assert spec.preemption.kill_grace_seconds == 30
    assert spec.max_runtime_seconds == 86400


def test_example_spec_defaults_change_nothing() -> None:
    parsed = load_job_spec_yaml(EXAMPLE_YAML)
    assert with_defaults(parsed) == parsed


@pytest.mark.parametrize(
    "mutation",
    [
        setting("instances", MAX_INSTANCES),
        setting("gang.min_instances", 1),
        setting("task.resources.gpu", 0),
        setting("task.resources.gpu", 64),
        setting("task.resources.cpu", 0.25),
        setting("task.resources.disk_mb", 0),
        setting(
            "task.constraints",
            [
                {"attribute": "rack", "op": "eq", "values": ["r1"]},
                {"attribute": "ssd", "op": "exists"},
                {"attribute": "zone", "op": "not_in", "values": ["z"]},
            ],
        ),
        setting(
            "task.constraints",
            [
                {"attribute": "gpu_model", "op": "in", "values": ["A100", "H100"]},
                {"any_of": [LEAF, {"attribute": "zone", "op": "exists"}]},
            ],
        ),
        setting("task.constraints", [{"any_of": [LEAF] * 15}, {"any_of": [LEAF] * 15}]),
        setting("placement", "pack"),
        setting("placement", "spread"),
        setting("task.ports", [f"p{i}" for i in range(16)]),
        setting("task.env", {"_X": "1", "PELOTONX": "ok"}),
        setting("pool", "/"),
        setting("pool", "/a.b/c_d/e-f"),
        setting("name", "n" * MAX_NAME),
        setting("priority", -1_000_000),
        setting("restart.max_failures", 100),
        setting("preemption.kill_grace_seconds", 3600),
        setting("max_runtime_seconds", 0),
        setting("task.command", "x" * MAX_COMMAND),
        setting("labels", {"k" * 63: "v" * MAX_LABEL_VALUE, "a/b.c-d_e": ""}),
        removing("labels"),
        removing("gang"),
        removing("pool"),
    ],
    ids=lambda m: m.__name__,
)
def test_boundary_specs_are_valid(mutation: Mutation) -> None:
    check(mutated(mutation))


def test_minimal_spec_gets_defaults() -> None:
    parsed = load_job_spec_yaml(MINIMAL_YAML)
    assert not parsed.HasField("restart") and not parsed.HasField("preemption")
    full = check(MINIMAL_YAML)
    assert full.pool == DEFAULT_POOL == "/default"
    assert full.gang.min_instances == 3
    assert full.restart.max_failures == DEFAULT_MAX_FAILURES == 3
    assert full.restart.backoff_seconds == DEFAULT_BACKOFF_SECONDS == 30
    assert full.preemption.kill_grace_seconds == DEFAULT_KILL_GRACE_SECONDS == 30
    assert full.preemption.preemptible is False
    assert full.priority == 0
    assert full.max_runtime_seconds == 0
    # with_defaults returns a copy: the parsed spec is untouched.
    assert parsed.pool == "" and parsed.gang.min_instances == 0
    assert not parsed.HasField("restart")


def test_defaults_do_not_override_given_values() -> None:
    text = MINIMAL_YAML + (
        "pool: /x/y\n"
        "gang: {min_instances: 2}\n"
        "restart: {max_failures: 7, backoff_seconds: 5}\n"
        "preemption: {preemptible: true, kill_grace_seconds: 9}\n"
    )
    full = check(text)
    assert full.pool == "/x/y"
    assert full.gang.min_instances == 2
    assert (full.restart.max_failures, full.restart.backoff_seconds) == (7, 5)
    assert full.preemption.kill_grace_seconds == 9
    assert full.preemption.preemptible is True


def test_fields_left_out_of_a_policy_block_get_their_defaults() -> None:
    # An explicit 0 is kept; a field not given takes its default, even inside a given block.
    full = check(MINIMAL_YAML + "restart: {max_failures: 0}\npreemption: {preemptible: true}\n")
    assert (full.restart.max_failures, full.restart.backoff_seconds) == (0, 30)
    assert full.preemption.kill_grace_seconds == 30
    full = check(MINIMAL_YAML + "preemption: {kill_grace_seconds: 0}\n")
    assert full.preemption.kill_grace_seconds == 0


def test_with_defaults_is_idempotent() -> None:
    once = with_defaults(load_job_spec_yaml(MINIMAL_YAML))
    assert with_defaults(once) == once


def test_validate_without_defaults_refuses_empty_spec() -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_job_spec(job_pb2.JobSpec())
    assert info.value.field == "name"


def test_pool_check_is_reusable_with_another_field_name() -> None:
    with pytest.raises(InvalidArgument) as info:
        specs.check_pool_path("nope", field="pool_path")
    assert info.value.field == "pool_path"
    specs.check_pool_path("/a/b", field="pool_path")


def test_parse_message_dict_reports_nested_unknown_keys() -> None:
    with pytest.raises(InvalidArgument) as info:
        specs.parse_message_dict({"resources": {"cpuu": 1}}, job_pb2.TaskSpec())
    assert info.value.field == "resources.cpuu"
    assert "did you mean resources.cpu?" in info.value.reason


def test_any_of_from_yaml() -> None:
    text = MINIMAL_YAML.replace(
        "  resources: {cpu: 0.5, mem_mb: 128}\n",
        """\
  resources: {cpu: 0.5, mem_mb: 128}
  constraints:
    - {attribute: gpu_model, op: in, values: [A100, H100]}
    - any_of:
        - {attribute: rack, op: eq, values: [r1]}
        - {attribute: zone, op: exists}
""",
    )
    first, either = check(text).task.constraints
    assert first.attribute == "gpu_model" and not first.any_of
    assert [(c.attribute, c.op, list(c.values)) for c in either.any_of] == [
        ("rack", "eq", ["r1"]),
        ("zone", "exists", []),
    ]
    assert not (either.attribute or either.op or either.values)


def test_placement_is_kept_and_empty_means_pack() -> None:
    assert check(MINIMAL_YAML + "placement: spread\n").placement == "spread"
    assert check(MINIMAL_YAML).placement == ""  # empty is pack; no default is written
