"""The parts of a console request: its query parameters and body, checked, each refusal naming
the parameter (INVALID_ARGUMENT)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from peloton.core.states import JobState
from peloton.errors import InvalidArgument

# A query's parameters, each with every value given.
Query = Mapping[str, Sequence[str]]


def json_object(data: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object (empty: {})."""
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        raise InvalidArgument("body", "is not JSON") from None
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object")
    return body


def known(query: Query, names: Sequence[str]) -> Query:
    """The query's parameters; INVALID_ARGUMENT names one the route does not take."""
    for name in query:
        if name not in names:
            which = ", ".join(names) if names else "none"
            raise InvalidArgument(name, f"unknown query parameter (this route takes: {which})")
    return query


def one(params: Query, name: str) -> str:
    """A parameter given at most once ("": not given)."""
    values = params.get(name, ())
    if len(values) > 1:
        raise InvalidArgument(name, "given more than once")
    return values[0] if values else ""


def number(name: str, text: str, least: int, most: int) -> int:
    """``text`` as a whole number in [least, most]."""
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(name, f"{text!r} is not a whole number") from None
    if not least <= value <= most:
        raise InvalidArgument(name, f"must be between {least} and {most} (got {value})")
    return value


def integer(params: Query, name: str, default: int, least: int, most: int) -> int:
    """A whole-number parameter in [least, most], ``default`` when not given."""
    text = one(params, name)
    return number(name, text, least, most) if text else default


def job_state(text: str) -> JobState:
    """A job state by name (PENDING, any case)."""
    try:
        return JobState(text.upper())
    except ValueError:
        states = ", ".join(s.value for s in JobState)
        raise InvalidArgument("state", f"{text!r} is no job state: one of {states}") from None


def label(text: str) -> tuple[str, str]:
    """A KEY=VALUE label filter."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise InvalidArgument("label", f"{text!r} is not KEY=VALUE")
    return key, value
