"""A sweep spec from YAML (``peloton sweep submit FILE``): the SweepSpec's fields by name, the
trial as a job spec, and two shorthands for the search space::

    space:
      lr: {log_uniform: [0.0001, 0.1]}     # or {log_uniform: {low: 0.0001, high: 0.1}}
      layers: {int: [1, 4]}
      optimizer: {choice: [sgd, adam]}     # or {choice: {values: [sgd, adam]}}

Unknown keys and wrong types are refused naming the key path (InvalidArgument). No I/O.
"""

from __future__ import annotations

from typing import Any

from peloton.core.spec import load_yaml, parse_message_dict
from peloton.errors import InvalidArgument
from peloton.v1 import sweep_pb2

_RANGES = ("uniform", "log_uniform", "int")


def _param(name: str, value: Any) -> Any:
    """One parameter with the shorthands spelled out."""
    if not isinstance(value, dict) or len(value) != 1:
        raise InvalidArgument(
            f"space.{name}", "give one of uniform, log_uniform, int, choice as {kind: ...}"
        )
    kind, body = next(iter(value.items()))
    if kind in _RANGES and isinstance(body, list):
        if len(body) != 2:
            raise InvalidArgument(f"space.{name}.{kind}", "give [low, high]")
        return {kind: {"low": body[0], "high": body[1]}}
    if kind == "choice":
        values = body if isinstance(body, list) else (body or {}).get("values", [])
        return {"choice": {"values": [str(v) for v in values]}}
    return value


def load_sweep_spec_yaml(text: str) -> sweep_pb2.SweepSpec:
    """Parse a sweep spec from YAML (see the module doc)."""
    data = load_yaml(text)
    if not isinstance(data, dict):
        raise InvalidArgument("spec", "must be a YAML mapping of sweep fields")
    space = data.get("space")
    if isinstance(space, dict):
        data = data | {"space": {str(k): _param(str(k), v) for k, v in space.items()}}
    return parse_message_dict(data, sweep_pb2.SweepSpec())
