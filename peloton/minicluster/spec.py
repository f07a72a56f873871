"""What a minicluster agent has: hostname, resources and attributes (the Mesos agent flags)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from peloton.minicluster.resources import ResourceSet, parse_text

DEFAULT_RESOURCES = "cpus:8;mem:32768;disk:100000;gpus:4;ports:[31000-32000]"
DEFAULT_ATTRIBUTES = "rack:r1;gpu_model:A100"

Attribute = str | float


def parse_attributes(text: str) -> dict[str, Attribute]:
    """Attributes in the Mesos agent flag syntax, ``rack:r1;gpu_model:A100;gen:3``.

    A value that parses as a number is a SCALAR attribute, anything else TEXT (as Mesos does).
    Raises ValueError naming the bad item.
    """
    out: dict[str, Attribute] = {}
    for item in text.split(";"):
        if not item.strip():
            continue
        name, sep, value = item.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ValueError(f"attribute {item.strip()!r}: expected NAME:VALUE")
        try:
            out[name] = float(value)
        except ValueError:
            out[name] = value
    return out


def attributes_json(attributes: Mapping[str, Attribute]) -> list[dict[str, Any]]:
    """Mesos v1 Attribute messages (JSON)."""
    out: list[dict[str, Any]] = []
    for name, value in attributes.items():
        if isinstance(value, float):
            out.append({"name": name, "type": "SCALAR", "scalar": {"value": value}})
        else:
            out.append({"name": name, "type": "TEXT", "text": {"value": value}})
    return out


@dataclass(frozen=True)
class AgentSpec:
    """One agent: its hostname, total resources and attributes (strings in the Mesos agent flag
    syntax).

    ``AgentSpec(hostname="h1", resources="cpus:4;mem:8192;disk:1000", attributes="rack:r2")``;
    ``resources="gpus(gpu):2;cpus(gpu):4;cpus:4;mem:8192"`` reserves some statically for the
    role ``gpu``. Agents may share a hostname (several agents on one machine): each registers
    with its own agent id, as in Mesos.
    """

    hostname: str
    resources: str = DEFAULT_RESOURCES
    attributes: str = DEFAULT_ATTRIBUTES

    def __post_init__(self) -> None:
        if not self.hostname or any(c.isspace() or c == "/" for c in self.hostname):
            raise ValueError(f"agent hostname {self.hostname!r}: must be non-empty, no spaces or /")
        self.total()  # validate early: a bad spec fails where it is written
        parse_attributes(self.attributes)

    def total(self) -> ResourceSet:
        """The agent's total resources."""
        try:
            return parse_text(self.resources)
        except ValueError as exc:
            raise ValueError(f"agent {self.hostname}: {exc}") from None

    def attribute_map(self) -> dict[str, Attribute]:
        """The agent's attributes by name."""
        return parse_attributes(self.attributes)

    @staticmethod
    def uniform(
        n: int,
        resources: str = DEFAULT_RESOURCES,
        attributes: str = DEFAULT_ATTRIBUTES,
        prefix: str = "agent-",
        hostnames: Sequence[str] | None = None,
    ) -> list[AgentSpec]:
        """``n`` identical agents named ``agent-0``, ``agent-1``, ... (or ``hostnames``, which
        may repeat: agents that share a machine)."""
        if n < 0:
            raise ValueError(f"agents: must be 0 or more (got {n})")
        names = list(hostnames) if hostnames is not None else [f"{prefix}{i}" for i in range(n)]
        if len(names) != n:
            raise ValueError(f"agents: need {n} hostnames (got {names})")
        # Parse once; the specs share the strings.
        parse_text(resources)
        parse_attributes(attributes)
        if hostnames is not None:
            return [AgentSpec(name, resources, attributes) for name in names]
        return [_unchecked(name, resources, attributes) for name in names]

    @staticmethod
    def load_file(path: str | Path) -> list[AgentSpec]:
        """Agents from a YAML file: a list of ``{hostname, resources, attributes}`` (or a mapping
        with an ``agents`` list); resources and attributes may be strings or mappings. Several
        agents may share a hostname.

        Raises ValueError naming the file and the bad entry.
        """
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{path}: cannot read agents file: {exc}") from None
        if isinstance(data, dict):
            data = data.get("agents")
        if not isinstance(data, list) or not data:
            raise ValueError(f"{path}: expected a non-empty list of agents")
        specs = []
        for i, entry in enumerate(data):
            try:
                specs.append(_spec_from_entry(entry, i))
            except ValueError as exc:
                raise ValueError(f"{path}: agents[{i}]: {exc}") from None
        return specs


def _unchecked(hostname: str, resources: str, attributes: str) -> AgentSpec:
    # 10,000 agents with one spec: skip re-parsing the same strings for each.
    spec = object.__new__(AgentSpec)
    object.__setattr__(spec, "hostname", hostname)
    object.__setattr__(spec, "resources", resources)
    object.__setattr__(spec, "attributes", attributes)
    return spec


def _flag_text(value: Any, what: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        parts = []
        for k, v in value.items():
            if isinstance(v, list):  # ports: [[31000, 32000]] or ["31000-32000"]
                items = [f"{r[0]}-{r[1]}" if isinstance(r, list) else str(r) for r in v]
                parts.append(f"{k}:[{','.join(items)}]")
            else:
                parts.append(f"{k}:{v}")
        return ";".join(parts)
    raise ValueError(f"{what}: must be a string or a mapping")


def _spec_from_entry(entry: Any, index: int) -> AgentSpec:
    if not isinstance(entry, dict):
        raise ValueError("must be a mapping with hostname, resources, attributes")
    unknown = set(entry) - {"hostname", "resources", "attributes"}
    if unknown:
        raise ValueError(f"unknown key {sorted(unknown)[0]}")
    resources = entry.get("resources", DEFAULT_RESOURCES)
    attributes = entry.get("attributes", "")
    return AgentSpec(
        hostname=str(entry.get("hostname") or f"agent-{index}"),
        resources=_flag_text(resources, "resources"),
        attributes=_flag_text(attributes, "attributes"),
    )
