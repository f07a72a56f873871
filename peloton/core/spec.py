"""Job spec: YAML loading, defaults and validation.

Every rule names the offending field with its dotted path (``task.resources.gpu``) and a reason, so
the gRPC API (INVALID_ARGUMENT) and the CLI (exit code 2) report exactly what to fix.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, TypeVar

import yaml
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from peloton.core.access import parse_grant, parse_permission
from peloton.core.containers import check_container, needs_command
from peloton.core.runas import check_user_name
from peloton.errors import InvalidArgument
from peloton.v1 import job_pb2, pool_pb2

M = TypeVar("M", bound=Message)

DEFAULT_POOL = "/default"
DEFAULT_MAX_FAILURES = 3
DEFAULT_BACKOFF_SECONDS = 30
DEFAULT_KILL_GRACE_SECONDS = 30
DEFAULT_ELASTIC_TIMEOUT_SECONDS = 60

MAX_INSTANCES = 100_000
MAX_NAME = 255
MAX_POOL_PATH = 512
MAX_PRIORITY = 1_000_000
MAX_LABELS = 64
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 255
MAX_COMMAND = 64 * 1024
MAX_ENV = 256
MAX_ENV_VALUE = 32 * 1024
MAX_CPU = 4096.0
MAX_MEM_MB = 16 * 1024 * 1024.0
MAX_DISK_MB = 1024 * 1024 * 1024.0
MAX_GPU = 64
# Constraints in all, those inside any_of included.
MAX_CONSTRAINTS = 32
# Levels of constraint lists: the task's list is 1, an any_of in it 2. An any_of directly in an
# any_of would add nothing (OR of ORs), so 2 is also the useful limit.
MAX_CONSTRAINT_DEPTH = 2
MAX_CONSTRAINT_VALUES = 64
MAX_PORTS = 16
MAX_FAILURES = 100
MAX_BACKOFF_SECONDS = 86_400
MAX_KILL_GRACE_SECONDS = 3_600
MAX_ELASTIC_TIMEOUT_SECONDS = 3_600
MAX_RUNTIME_SECONDS = 365 * 86_400
# A spec file nests a few levels; deeper YAML would exhaust the parser's recursion.
MAX_YAML_DEPTH = 32
# Values in a spec file once aliases are expanded: bounds an alias bomb ("billion laughs"),
# whose few lines expand to more than memory holds.
MAX_YAML_VALUES = 100_000

CONSTRAINT_OPS = ("in", "not_in", "eq", "exists")
# JobSpec.placement; empty means the first.
PLACEMENTS = ("pack", "spread")
# Variables peloton and Mesos set in every task; a spec may not override them.
RESERVED_ENV_PREFIXES = ("PELOTON_", "MESOS_")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_POOL_SEGMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ATTRIBUTE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_PORT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


# ---------------------------------------------------------------------------- YAML


class _BoundedLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing documents nested deeper than MAX_YAML_DEPTH or holding
    more than MAX_YAML_VALUES values with aliases expanded."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise InvalidArgument("spec", f"YAML nests deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None and _expanded_size(node, {}) > MAX_YAML_VALUES:
            raise InvalidArgument(
                "spec", f"YAML holds more than {MAX_YAML_VALUES} values with aliases expanded"
            )
        return node


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` stands for once its aliases are expanded (each aliased node
    counted once per use, computed once)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    sizes[key] = MAX_YAML_VALUES + 1  # an anchor that contains its own alias never ends
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        children = []
    sizes[key] = 1 + sum(_expanded_size(child, sizes) for child in children)
    return sizes[key]


def load_yaml(text: str) -> Any:
    """The YAML document in ``text``, nesting and alias expansion bounded (InvalidArgument)."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader: plain data only
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidArgument("spec", f"not valid YAML{where}") from exc


def load_job_spec_yaml(text: str) -> job_pb2.JobSpec:
    """Parse a job spec from YAML, rejecting unknown keys and wrong types (InvalidArgument)."""
    data = load_yaml(text)
    if not isinstance(data, dict):
        raise InvalidArgument("spec", "must be a YAML mapping of job fields")
    return parse_message_dict(data, job_pb2.JobSpec())


def parse_message_dict(data: dict[str, Any], message: M) -> M:
    """Fill ``message`` from a plain dict using proto field names; errors name the key path."""
    check_known_keys(data, message.DESCRIPTOR, "")
    try:
        json_format.ParseDict(data, message)
    except json_format.ParseError as exc:
        field, reason = _split_parse_error(str(exc))
        raise InvalidArgument(field, reason) from exc
    return message


def check_known_keys(data: Any, descriptor: Any, prefix: str) -> None:
    """Reject a key that is not a field of ``descriptor``, suggesting the closest field name."""
    if not isinstance(data, dict):
        return
    fields = descriptor.fields_by_name
    for key, value in data.items():
        path = f"{prefix}{key}"
        if not isinstance(key, str) or key not in fields:
            hint = difflib.get_close_matches(str(key), list(fields), n=1)
            suggestion = f" (did you mean {prefix}{hint[0]}?)" if hint else ""
            raise InvalidArgument(path, f"unknown key{suggestion}")
        field = fields[key]
        if field.type != FieldDescriptor.TYPE_MESSAGE or _is_map(field):
            continue
        if _is_repeated(field) and isinstance(value, list):
            for i, item in enumerate(value):
                check_known_keys(item, field.message_type, f"{path}[{i}].")
        else:
            check_known_keys(value, field.message_type, f"{path}.")


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _is_map(field: FieldDescriptor) -> bool:
    message_type = field.message_type
    return message_type is not None and message_type.GetOptions().map_entry


def _split_parse_error(text: str) -> tuple[str, str]:
    # json_format says 'Failed to parse instances field: <why>.'; name the field on its own.
    fields = re.findall(r"Failed to parse (\w+) field: ", text)
    reason = text.rsplit("field: ", 1)[-1].rstrip(".") if fields else text
    return (".".join(fields) or "spec"), f"wrong type: {reason}"


# ---------------------------------------------------------------------------- defaults


def with_defaults(spec: job_pb2.JobSpec) -> job_pb2.JobSpec:
    """A copy of ``spec`` with omitted optional fields set to their documented defaults."""
    out = job_pb2.JobSpec()
    out.CopyFrom(spec)
    if not out.pool:
        out.pool = DEFAULT_POOL
    if out.gang.max_instances and out.instances == 0:
        out.instances = out.gang.max_instances
    if out.gang.min_instances == 0:
        out.gang.min_instances = 1 if out.gang.max_instances else out.instances
    if out.gang.max_instances and out.gang.elastic_timeout_seconds == 0:
        out.gang.elastic_timeout_seconds = DEFAULT_ELASTIC_TIMEOUT_SECONDS
    if not out.restart.HasField("max_failures"):
        out.restart.max_failures = DEFAULT_MAX_FAILURES
    if not out.restart.HasField("backoff_seconds"):
        out.restart.backoff_seconds = DEFAULT_BACKOFF_SECONDS
    if not out.preemption.HasField("kill_grace_seconds"):
        out.preemption.kill_grace_seconds = DEFAULT_KILL_GRACE_SECONDS
    return out


# ---------------------------------------------------------------------------- validation


def validate_job_spec(spec: job_pb2.JobSpec) -> None:
    """Raise InvalidArgument naming the first field that breaks a rule."""
    _check_name(spec.name)
    _check_pool(spec.pool)
    if abs(spec.priority) > MAX_PRIORITY:
        raise InvalidArgument("priority", f"must be between -{MAX_PRIORITY} and {MAX_PRIORITY}")
    _check_labels(spec.labels)
    if spec.instances == 0:
        raise InvalidArgument("instances", "must be at least 1")
    if spec.instances > MAX_INSTANCES:
        raise InvalidArgument("instances", f"must be at most {MAX_INSTANCES}")
    _check_elastic(spec)
    if spec.gang.min_instances > spec.instances:
        raise InvalidArgument(
            "gang.min_instances",
            f"is {spec.gang.min_instances}, more than instances ({spec.instances})",
        )
    if not spec.HasField("task"):
        raise InvalidArgument("task", "is required")
    _check_task(spec.task)
    if spec.restart.max_failures > MAX_FAILURES:
        raise InvalidArgument("restart.max_failures", f"must be at most {MAX_FAILURES}")
    if spec.restart.backoff_seconds > MAX_BACKOFF_SECONDS:
        raise InvalidArgument("restart.backoff_seconds", f"must be at most {MAX_BACKOFF_SECONDS}")
    if spec.preemption.kill_grace_seconds > MAX_KILL_GRACE_SECONDS:
        raise InvalidArgument(
            "preemption.kill_grace_seconds", f"must be at most {MAX_KILL_GRACE_SECONDS}"
        )
    if spec.max_runtime_seconds > MAX_RUNTIME_SECONDS:
        raise InvalidArgument("max_runtime_seconds", f"must be at most {MAX_RUNTIME_SECONDS}")
    if spec.placement and spec.placement not in PLACEMENTS:
        raise InvalidArgument(
            "placement", f"unknown placement {spec.placement!r}; use {' or '.join(PLACEMENTS)}"
        )
    if spec.user:
        check_user_name(spec.user)


def _check_elastic(spec: job_pb2.JobSpec) -> None:
    gang = spec.gang
    if not gang.max_instances:
        if gang.elastic_timeout_seconds:
            raise InvalidArgument(
                "gang.elastic_timeout_seconds", "applies only to elastic gangs (gang.max_instances)"
            )
        return
    if gang.max_instances != spec.instances:
        raise InvalidArgument(
            "gang.max_instances",
            f"is {gang.max_instances} but instances is {spec.instances}: an elastic gang's "
            "instances is its maximum; leave instances out or make them equal",
        )
    if gang.min_instances > gang.max_instances:
        raise InvalidArgument(
            "gang.min_instances",
            f"is {gang.min_instances}, more than gang.max_instances ({gang.max_instances})",
        )
    if gang.elastic_timeout_seconds > MAX_ELASTIC_TIMEOUT_SECONDS:
        raise InvalidArgument(
            "gang.elastic_timeout_seconds", f"must be at most {MAX_ELASTIC_TIMEOUT_SECONDS}"
        )


def _check_name(name: str) -> None:
    if not name:
        raise InvalidArgument("name", "is required")
    if len(name) > MAX_NAME:
        raise InvalidArgument("name", f"is longer than {MAX_NAME} characters")
    if not _NAME_RE.match(name):
        raise InvalidArgument("name", "may hold only letters, digits, '.', '_' and '-'")


def check_pool_path(path: str, field: str = "pool") -> None:
    """A pool path is absolute, '/'-separated, with non-empty simple segments."""
    if len(path) > MAX_POOL_PATH:
        raise InvalidArgument(field, f"is longer than {MAX_POOL_PATH} characters")
    if not path.startswith("/"):
        raise InvalidArgument(field, f"{path!r} must be an absolute path such as /research/vision")
    if path == "/":
        return
    for segment in path[1:].split("/"):
        if not _POOL_SEGMENT_RE.match(segment):
            raise InvalidArgument(field, f"{path!r} has an empty or invalid segment {segment!r}")


def _check_pool(pool: str) -> None:
    check_pool_path(pool)


def _check_labels(labels: Any) -> None:
    if len(labels) > MAX_LABELS:
        raise InvalidArgument("labels", f"at most {MAX_LABELS} labels")
    for key, value in labels.items():
        if len(key) > MAX_LABEL_KEY or not _LABEL_KEY_RE.match(key):
            raise InvalidArgument(
                f"labels.{key}",
                f"key must be 1-{MAX_LABEL_KEY} letters, digits, '.', '_', '/' or '-'",
            )
        if len(value) > MAX_LABEL_VALUE:
            raise InvalidArgument(f"labels.{key}", f"value is longer than {MAX_LABEL_VALUE}")


def _check_task(task: job_pb2.TaskSpec) -> None:
    if needs_command(task) and not task.command.strip():
        raise InvalidArgument("task.command", "must not be empty")
    if len(task.command) > MAX_COMMAND:
        raise InvalidArgument("task.command", f"is longer than {MAX_COMMAND} bytes")
    _check_env(task.env)
    _check_resources(task)
    if task.HasField("container"):
        check_container(task)
    _check_constraints(task.constraints)
    _check_ports(task.ports)


def _check_env(env: Any) -> None:
    if len(env) > MAX_ENV:
        raise InvalidArgument("task.env", f"at most {MAX_ENV} variables")
    for name, value in env.items():
        if not _ENV_NAME_RE.match(name):
            raise InvalidArgument(f"task.env.{name}", "is not a valid environment variable name")
        if name.startswith(RESERVED_ENV_PREFIXES):
            raise InvalidArgument(
                f"task.env.{name}", "PELOTON_* and MESOS_* variables are set by peloton"
            )
        if len(value) > MAX_ENV_VALUE:
            raise InvalidArgument(f"task.env.{name}", f"value is longer than {MAX_ENV_VALUE}")


def _check_amount(field: str, value: float, maximum: float, *, positive: bool) -> None:
    if not math.isfinite(value):
        raise InvalidArgument(field, "must be a finite number")
    if value < 0:
        raise InvalidArgument(field, f"must not be negative (got {value:g})")
    if positive and value == 0:
        raise InvalidArgument(field, "must be greater than 0")
    if value > maximum:
        raise InvalidArgument(field, f"must be at most {maximum:g} (got {value:g})")


def _check_resources(task: job_pb2.TaskSpec) -> None:
    if not task.HasField("resources"):
        raise InvalidArgument("task.resources", "is required (cpu and mem_mb at least)")
    r = task.resources
    _check_amount("task.resources.cpu", r.cpu, MAX_CPU, positive=True)
    _check_amount("task.resources.mem_mb", r.mem_mb, MAX_MEM_MB, positive=True)
    _check_amount("task.resources.disk_mb", r.disk_mb, MAX_DISK_MB, positive=False)
    _check_amount("task.resources.gpu", r.gpu, MAX_GPU, positive=False)
    if r.gpu != int(r.gpu):
        raise InvalidArgument(
            "task.resources.gpu", f"must be a whole number of GPUs (got {r.gpu:g})"
        )


def _check_constraints(constraints: Any) -> None:
    total = _count_constraints(constraints)
    if total > MAX_CONSTRAINTS:
        raise InvalidArgument(
            "task.constraints",
            f"at most {MAX_CONSTRAINTS} constraints, those inside any_of included (got {total})",
        )
    _check_constraint_list(constraints, "task.constraints", 1)


def _count_constraints(constraints: Any) -> int:
    return sum(1 + _count_constraints(c.any_of) for c in constraints)


def _check_constraint_list(constraints: Any, field: str, depth: int) -> None:
    for i, c in enumerate(constraints):
        item = f"{field}[{i}]"
        if c.any_of:
            _check_any_of(c, item, depth)
        elif not (c.attribute or c.op or c.values):
            raise InvalidArgument(item, "needs attribute and op, or a non-empty any_of")
        else:
            _check_leaf(c, item)


def _check_any_of(c: job_pb2.Constraint, field: str, depth: int) -> None:
    beside = [name for name in ("attribute", "op", "values") if getattr(c, name)]
    if beside:
        raise InvalidArgument(
            f"{field}.{beside[0]}", "not allowed beside any_of; put it in an any_of branch"
        )
    if depth >= MAX_CONSTRAINT_DEPTH:
        raise InvalidArgument(
            f"{field}.any_of",
            f"constraints nest at most {MAX_CONSTRAINT_DEPTH} levels deep (an any_of in an any_of "
            "adds nothing: list its branches directly)",
        )
    _check_constraint_list(c.any_of, f"{field}.any_of", depth + 1)


def _check_leaf(c: job_pb2.Constraint, field: str) -> None:
    if not _ATTRIBUTE_RE.match(c.attribute):
        raise InvalidArgument(f"{field}.attribute", "must name a host attribute")
    if c.op not in CONSTRAINT_OPS:
        raise InvalidArgument(
            f"{field}.op", f"unknown op {c.op!r}; use one of {', '.join(CONSTRAINT_OPS)}"
        )
    n = len(c.values)
    if c.op in ("in", "not_in") and n == 0:
        raise InvalidArgument(f"{field}.values", f"op {c.op} needs at least one value")
    if c.op == "eq" and n != 1:
        raise InvalidArgument(f"{field}.values", "op eq needs exactly one value")
    if c.op == "exists" and n != 0:
        raise InvalidArgument(f"{field}.values", "op exists takes no values")
    if n > MAX_CONSTRAINT_VALUES:
        raise InvalidArgument(f"{field}.values", f"at most {MAX_CONSTRAINT_VALUES} values")


def _check_ports(ports: Any) -> None:
    if len(ports) > MAX_PORTS:
        raise InvalidArgument("task.ports", f"at most {MAX_PORTS} named ports")
    seen: set[str] = set()
    for i, name in enumerate(ports):
        if not _PORT_NAME_RE.match(name):
            raise InvalidArgument(
                f"task.ports[{i}]", "must be lower-case letters, digits and '_', 1-32 long"
            )
        if name in seen:
            raise InvalidArgument(f"task.ports[{i}]", f"duplicate port name {name!r}")
        seen.add(name)


def is_gang(spec: job_pb2.JobSpec) -> bool:
    """Whether the job's tasks live and die together (an elastic gang: its first
    ``min_instances``; the rest come and go)."""
    return spec.gang.min_instances > 1 or is_elastic(spec)


def is_elastic(spec: job_pb2.JobSpec) -> bool:
    """Whether the job is an elastic gang: any size from ``min_instances`` to
    ``max_instances``."""
    return spec.gang.max_instances > 0


def load_pool_spec_yaml(text: str) -> pool_pb2.PoolSpec:
    """A pool spec from YAML; policies may be written ``static``/``elastic``, ``fifo``/
    ``priority_fifo``, permissions ``view``/``submit``/``admin``, and a grant also as one
    string (``submit=user:alice``). Unknown keys and wrong types raise InvalidArgument naming
    the key."""
    data = load_yaml(text)
    if not isinstance(data, dict):
        raise InvalidArgument("spec", "must be a YAML mapping of pool fields")
    resources = data.get("resources") or {}
    if not isinstance(resources, dict):
        raise InvalidArgument(
            "resources", "must map a kind (cpu, mem_mb, disk_mb, gpu) to settings"
        )
    for settings in resources.values():
        if isinstance(settings, dict) and isinstance(settings.get("policy"), str):
            settings["policy"] = _enum_name("RESOURCE_POLICY_", settings["policy"])
    if isinstance(data.get("queue_policy"), str):
        data["queue_policy"] = _enum_name("QUEUE_POLICY_", data["queue_policy"])
    if isinstance(data.get("grants"), list):
        data["grants"] = [_grant_dict(g, f"grants[{i}]") for i, g in enumerate(data["grants"])]
    return parse_message_dict(data, pool_pb2.PoolSpec())


def _grant_dict(item: Any, field: str) -> Any:
    """A pool file's grant as PoolSpec.grants holds it: ``submit=user:alice``, or a mapping
    ({user: alice, permission: submit}); the parser refuses a mapping's other keys."""
    if isinstance(item, str):
        grant = parse_grant(item, field)
        return {
            grant.principal.kind: grant.principal.name,
            "permission": f"PERMISSION_{grant.permission.name}",
        }
    if not isinstance(item, dict):
        raise InvalidArgument(
            field, "must be PERMISSION=user:NAME, PERMISSION=group:NAME or a mapping"
        )
    if isinstance(item.get("permission"), str):
        permission = parse_permission(item["permission"], f"{field}.permission")
        return {**item, "permission": f"PERMISSION_{permission.name}"}
    return item


def _enum_name(prefix: str, value: str) -> str:
    name = value.strip().upper()
    return name if name.startswith(prefix) else prefix + name
