"""Run-as users: which Unix users a caller may run its tasks as (like Mesos's ``run_tasks`` ACL).

A job's tasks run as ``JobSpec.user`` (Mesos ``CommandInfo.user``), or as the framework's user
when it is empty. The allow-list is a list of rules, each naming callers (``users``, ``groups``)
and the Unix users they may run as (``run_as``)::

    - {users: [alice], groups: [ml], run_as: [alice, mlbatch]}
    - {users: ["*"], run_as: [$self]}        # every authenticated caller as itself
    - {users: [anonymous], run_as: [nobody]} # callers of a daemon without authentication

The rules, all of them pure (no I/O, no clock):

- a rule applies to a caller named in its ``users`` or in one of whose groups is in its
  ``groups``; ``"*"`` in ``users`` applies to every authenticated caller; the caller of a daemon
  without authentication (:data:`~peloton.core.access.ANONYMOUS`) is named ``anonymous``;
- a caller may run as the union of ``run_as`` over the rules that apply to it, where ``$self``
  stands for the caller's own name (nothing for the anonymous caller) and ``"*"`` for any user;
- nothing else is allowed: a caller no rule applies to may run as no one (an empty ``user``, the
  framework's own, is not checked here: the operator chose it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from peloton.core.access import Caller
from peloton.errors import InvalidArgument

# The caller's own name in ``run_as``.
SELF = "$self"
# Every authenticated caller in ``users``; any user in ``run_as``.
ANY = "*"
# The name the rules give the caller of a daemon without authentication.
ANONYMOUS_NAME = "anonymous"

# A user name as shadow's useradd takes it (portable characters, not starting with a digit or
# '-', at most 32 characters): what an agent can look up with getpwnam.
MAX_USER_NAME = 32
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_RULE_KEYS = ("users", "groups", "run_as")


def check_user_name(name: str, field: str = "user") -> None:
    """InvalidArgument naming ``field`` unless ``name`` is a valid Unix user name."""
    if len(name) > MAX_USER_NAME:
        raise InvalidArgument(field, f"{name[:40]!r}... is longer than {MAX_USER_NAME} characters")
    if not _USER_RE.match(name):
        raise InvalidArgument(
            field,
            f"{name!r} is not a Unix user name: letters, digits, '_', '.' and '-', "
            "starting with a letter or '_'",
        )


@dataclass(frozen=True)
class RunAsRule:
    """Callers (by name or group) and the users they may run tasks as."""

    users: frozenset[str]
    groups: frozenset[str]
    run_as: frozenset[str]

    def applies_to(self, caller: Caller) -> bool:
        if caller.anonymous:
            return ANONYMOUS_NAME in self.users
        return caller.name in self.users or ANY in self.users or bool(self.groups & caller.groups)

    def allows(self, caller: Caller, user: str) -> bool:
        """Whether this rule lets ``caller`` run as ``user`` (if it applies to the caller)."""
        if ANY in self.run_as or user in self.run_as:
            return True
        return SELF in self.run_as and not caller.anonymous and user == caller.name


@dataclass(frozen=True)
class RunAsRules:
    """The allow-list: a caller may run as a user if a rule that applies to it allows it."""

    rules: tuple[RunAsRule, ...]

    def allows(self, caller: Caller, user: str) -> bool:
        return any(r.applies_to(caller) and r.allows(caller, user) for r in self.rules)

    @classmethod
    def parse(cls, data: Any, source: str = "run_as_file") -> RunAsRules:
        """The rules of a loaded YAML document (a list of mappings); InvalidArgument naming
        ``source`` and the entry (``run_as_file[2].run_as``) that breaks a rule. An empty
        document is no rule at all (nobody may run as anyone)."""
        if data is None:
            return cls(())
        if not isinstance(data, list):
            raise InvalidArgument(source, "must be a list of {users, groups, run_as} entries")
        return cls(tuple(_rule(entry, f"{source}[{i}]") for i, entry in enumerate(data)))


def _rule(entry: Any, where: str) -> RunAsRule:
    if not isinstance(entry, Mapping):
        raise InvalidArgument(where, "must be a mapping with users, groups and run_as")
    unknown = sorted(str(k) for k in entry if k not in _RULE_KEYS)
    if unknown:
        raise InvalidArgument(
            where, f"unknown key {unknown[0]!r}; an entry has {', '.join(_RULE_KEYS)}"
        )
    users = _names(entry.get("users"), f"{where}.users")
    groups = _names(entry.get("groups"), f"{where}.groups")
    if not users and not groups:
        raise InvalidArgument(where, "names no caller: give users or groups")
    run_as = _names(entry.get("run_as"), f"{where}.run_as")
    if not run_as:
        raise InvalidArgument(f"{where}.run_as", "is required: the users the callers may run as")
    for user in run_as - {SELF, ANY}:
        check_user_name(user, f"{where}.run_as")
    return RunAsRule(users, groups, run_as)


def _names(value: Any, where: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgument(where, "must be a list of names")
    names = list(value)
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        raise InvalidArgument(where, f"{bad[0]!r} is not a name")
    return frozenset(names)
