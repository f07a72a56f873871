"""The run-as allow-list file (option ``run_as_file``): which Unix users each caller may run
its tasks as, checked when a job is created (rules: :mod:`peloton.core.runas`).

The file is read when the daemon starts (a file that cannot be read or breaks a rule stops it,
naming the entry) and again whenever it changes (its modification time, size or inode, looked at
on each check: a stat per CreateJob). A change that cannot be read or breaks a rule (or the
file's removal) is logged and counted once, and the rules read last stay in force: a typo in the
file never opens or closes the cluster by accident. Write a new version elsewhere and rename it
into place, so that no check reads it half written.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter

from peloton.core.access import Caller
from peloton.core.runas import RunAsRules, check_user_name
from peloton.core.spec import load_yaml
from peloton.errors import InvalidArgument, PermissionDenied

log = logging.getLogger(__name__)

OPTION = "run_as_file"


class RunAsMetrics:
    """Jobs refused for their user, and changes of the file that could not be used."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.denied = Counter(
            "peloton_run_as_denied",
            "Jobs refused because their caller may not run tasks as the job's user.",
            registry=self.registry,
        )
        self.file_errors = Counter(
            "peloton_run_as_file_errors",
            "Changes of run_as_file that could not be read or broke a rule (the rules read "
            "last stay in force).",
            registry=self.registry,
        )


class RunAsFile:
    """The allow-list of a YAML file, re-read when it changes. Thread-safe."""

    def __init__(self, path: Path, metrics: RunAsMetrics | None = None) -> None:
        """Reads the file: InvalidArgument naming ``run_as_file`` (or its entry) if it cannot."""
        self.path = path
        self.metrics = metrics or RunAsMetrics()
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = self._stat()
        self._rules = self._read()

    def rules(self) -> RunAsRules:
        """The rules in force: the file's, re-read first if it changed since the last read."""
        with self._lock:
            try:
                stamp = self._stat()
            except InvalidArgument as exc:
                return self._keep(None, exc)
            if stamp != self._stamp:
                try:
                    rules = self._read()
                except InvalidArgument as exc:
                    return self._keep(stamp, exc)
                self._stamp, self._rules = stamp, rules
                log.info(
                    "run-as rules reloaded",
                    extra={"path": str(self.path), "rules": len(rules.rules)},
                )
            return self._rules

    def _keep(self, stamp: tuple[int, int, int] | None, error: InvalidArgument) -> RunAsRules:
        """A change of the file that cannot be used (``stamp`` None: the file is gone): the
        rules read last stay; reported once, until the file changes again."""
        if stamp != self._stamp:
            self._stamp = stamp
            self.metrics.file_errors.inc()
            log.error(
                "run-as rules not reloaded: the previous rules stay in force",
                extra={"path": str(self.path), "error": str(error)},
            )
        return self._rules

    def check(self, caller: Caller, user: str) -> None:
        """Allow ``caller`` to run tasks as ``user`` or raise: InvalidArgument (naming ``user``)
        for a name that is no user name, PermissionDenied if no rule allows it. An empty user
        (the framework's) is not checked."""
        if not user:
            return
        check_user_name(user)
        if self.rules().allows(caller, user):
            return
        self.metrics.denied.inc()
        log.warning("run-as user refused", extra={"caller": str(caller), "user": user})
        raise PermissionDenied(f"{caller} may not run tasks as {user}")

    def _stat(self) -> tuple[int, int, int]:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise InvalidArgument(OPTION, f"cannot read {self.path}: {exc.strerror}") from exc
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _read(self) -> RunAsRules:
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise InvalidArgument(OPTION, f"cannot read {self.path}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise InvalidArgument(OPTION, f"{self.path} is not UTF-8 text") from exc
        try:
            data = load_yaml(text)
        except InvalidArgument as exc:
            raise InvalidArgument(OPTION, f"{self.path}: {exc.reason}") from exc
        return RunAsRules.parse(data, OPTION)


class AnyUser:
    """No allow-list (``run_as_file`` unset): any caller may run tasks as any valid user name,
    as on Mesos without a ``run_tasks`` ACL."""

    def check(self, caller: Caller, user: str) -> None:
        if user:
            check_user_name(user)


# What CreateJob checks a job's user with.
RunAsPolicy = RunAsFile | AnyUser


def run_as_policy(path: str, metrics: RunAsMetrics | None = None) -> RunAsPolicy:
    """The run-as check for the option's value: the file's rules, or :class:`AnyUser`."""
    return RunAsFile(Path(path), metrics) if path else AnyUser()
