"""How agents run tasks: real processes in sandboxes, or a simulation on a clock.

Both are called by the master under its lock and report back through
:meth:`Master.agent_update` / :meth:`Master.task_exited`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peloton.minicluster.master import Master
from peloton.minicluster.model import Agent, Executor, Task

# Read from a task's CommandInfo environment in simulated mode.
SIM_DURATION_ENV = "PELOTON_SIM_DURATION"
SIM_EXIT_CODE_ENV = "PELOTON_SIM_EXIT_CODE"

TaskDuration = Callable[[dict[str, Any]], float | None]


def command_env(info: dict[str, Any]) -> dict[str, str]:
    """The VALUE variables of a TaskInfo's CommandInfo.environment."""
    command = info.get("command")
    environment = command.get("environment") if isinstance(command, dict) else None
    variables = environment.get("variables") if isinstance(environment, dict) else None
    out: dict[str, str] = {}
    for var in variables if isinstance(variables, list) else []:
        if isinstance(var, dict) and var.get("type", "VALUE") == "VALUE" and "name" in var:
            out[str(var["name"])] = str(var.get("value", ""))
    return out


def lookup_user(executor: Executor) -> tuple[pwd.struct_passwd | None, str]:
    """(the executor's user, '') or (None, why its directory cannot be made), in a Mesos
    agent's words (``--switch_user``, its default: an empty or unknown user fails the executor).
    """
    try:
        return pwd.getpwnam(executor.user), ""
    except KeyError:
        return None, _directory_error(executor, f"No such user '{executor.user}'")


def _directory_error(executor: Executor, why: str) -> str:
    directory = executor.directory or Path(
        "frameworks",
        executor.framework_id,
        "executors",
        executor.executor_id,
        "runs",
        executor.run_id,
    )
    return (
        f"Failed to create executor directory '{directory}': "
        f"Failed to chown directory to '{executor.user}': {why}"
    )


def task_sandbox(task: Task) -> Path | None:
    """A task's sandbox: its own dir under the default executor's run dir (a nested container),
    or the command executor's run dir."""
    directory = task.executor.directory
    if directory is None:
        return None
    return directory / "tasks" / task.task_id if task.executor.group else directory


class ProcessRunner:
    """Each task is ``sh -c value`` (or ``value`` with ``arguments``) in its own session, so a
    kill reaches everything it started; stdout and stderr go to files in its sandbox.

    As a Mesos agent with ``--switch_user`` (its default): the executor's directory is owned by
    the framework's user (a command task's CommandInfo.user if set), an empty or unknown user
    fails the executor, and when the agent runs as root its tasks run as that user (its uid,
    gid and groups); an agent that is not root can only run tasks as itself.
    """

    def __init__(self, master: Master) -> None:
        self.master = master
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    def prepare(self, executor: Executor) -> str:
        user, error = lookup_user(executor)
        if user is None:
            return error
        directory = executor.directory
        assert directory is not None
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"Failed to create executor directory '{directory}': {exc.strerror}"
        if user.pw_uid == os.geteuid():
            return ""
        try:
            os.chown(directory, user.pw_uid, user.pw_gid)
        except OSError as exc:
            return _directory_error(executor, f"Failed to chown '{directory}': {exc.strerror}")
        groups = os.getgrouplist(user.pw_name, user.pw_gid)
        executor.run_as = (user.pw_uid, user.pw_gid, tuple(groups))
        return ""

    def start(self, agent: Agent, task: Task) -> None:
        sandbox = task_sandbox(task)
        assert sandbox is not None and task.executor.directory is not None
        run_as = task.executor.run_as
        try:
            sandbox.mkdir(parents=True, exist_ok=True)
            _link_latest(task.executor.directory)
            for path in (sandbox, sandbox / "stdout", sandbox / "stderr"):
                path.touch()
                if run_as is not None:
                    os.chown(path, run_as[0], run_as[1])
        except OSError as exc:
            self.master.task_exited(task, None, f"Failed to create the sandbox: {exc}")
            return
        task.sandbox = sandbox
        self.master.agent_update(task, "TASK_STARTING")
        argv, executable = _argv(task.info)
        switch: dict[str, Any] = {}
        if run_as is not None:
            switch = {"user": run_as[0], "group": run_as[1], "extra_groups": list(run_as[2])}
        try:
            with open(sandbox / "stdout", "ab") as out, open(sandbox / "stderr", "ab") as err:
                proc = subprocess.Popen(
                    argv,
                    executable=executable,
                    cwd=sandbox,
                    env=self._env(agent, task, sandbox),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    **switch,
                )
        except OSError as exc:
            self.master.task_exited(task, None, f"Failed to launch the command: {exc}")
            return
        task.handle, task.pid = proc, proc.pid
        self._procs[proc.pid] = proc
        self.master.agent_update(task, "TASK_RUNNING")
        threading.Thread(
            target=self._wait, args=(task, proc), name=f"task-{task.task_id}", daemon=True
        ).start()

    def _env(self, agent: Agent, task: Task, sandbox: Path) -> dict[str, str]:
        # A Mesos agent passes its own environment on, then sets what Mesos sets.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MESOS_") and k != "CUDA_VISIBLE_DEVICES"
        }
        env.update(
            MESOS_SANDBOX=str(sandbox),
            MESOS_DIRECTORY=str(task.executor.directory),
            MESOS_TASK_ID=task.task_id,
            MESOS_FRAMEWORK_ID=task.framework_id,
            MESOS_EXECUTOR_ID=task.executor.executor_id,
            MESOS_SLAVE_ID=agent.id,
            MESOS_AGENT_ENDPOINT=f"{agent.ip}:{agent.port}",
            MESOS_CHECKPOINT="1",
            MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD="5secs",
        )
        if agent.total.scalar("gpus") > 0:
            # Mesos GPU isolation exposes only the task's devices; a task without GPUs sees none.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in task.gpus)
        env.update(command_env(task.info))
        return env

    def _wait(self, task: Task, proc: subprocess.Popen[bytes]) -> None:
        returncode = proc.wait()
        # The session may hold children the command left behind: the container dies whole.
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        with self.master.lock:
            self._procs.pop(proc.pid, None)
            if not task.abandoned:
                self.master.task_exited(task, returncode)

    def kill(self, task: Task, grace: float) -> None:
        proc = task.handle
        if not isinstance(proc, subprocess.Popen) or proc.returncode is not None:
            return
        if grace <= 0:
            _signal(proc, signal.SIGKILL)
            return
        _signal(proc, signal.SIGTERM)
        task.kill_timer = self.master.timers.call_later(
            grace, lambda: _signal(proc, signal.SIGKILL)
        )

    def kill_agent(self, agent: Agent) -> None:
        for task in agent.tasks.values():
            task.abandoned = True
            if isinstance(task.handle, subprocess.Popen):
                _signal(task.handle, signal.SIGKILL)

    def stop(self) -> None:
        """SIGKILL every task process and reap it."""
        with self.master.lock:
            procs = list(self._procs.values())
            for agent in self.master.agents.values():
                for task in agent.tasks.values():
                    task.abandoned = True
        for proc in procs:
            _signal(proc, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if proc.returncode is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)


def _argv(info: dict[str, Any]) -> tuple[list[str], str | None]:
    command = info.get("command") or {}
    value = str(command.get("value", ""))
    if command.get("shell", True):
        return ["/bin/sh", "-c", value], None
    # shell=false is execvp(value, arguments); arguments include argv[0].
    args = [str(a) for a in command.get("arguments") or []] or [value]
    return args, value


def _link_latest(run_dir: Path) -> None:
    latest = run_dir.parent / "latest"
    if latest.is_symlink() or latest.exists():
        if os.readlink(latest) == run_dir.name:
            return
        latest.unlink()
    latest.symlink_to(run_dir.name)


class SimulatedRunner:
    """No processes: a task is RUNNING at once and ends after its duration (``task_duration``,
    else the ``PELOTON_SIM_DURATION`` seconds in its environment, else when killed) with the exit
    code in ``PELOTON_SIM_EXIT_CODE`` (default 0)."""

    def __init__(self, master: Master, task_duration: TaskDuration | None = None) -> None:
        self.master = master
        self.task_duration = task_duration

    def prepare(self, executor: Executor) -> str:
        """No directory, no processes: only an empty or unknown user fails the executor."""
        return lookup_user(executor)[1]

    def start(self, agent: Agent, task: Task) -> None:
        self.master.agent_update(task, "TASK_STARTING")
        self.master.agent_update(task, "TASK_RUNNING")
        env = command_env(task.info)
        duration = self.task_duration(task.info) if self.task_duration else None
        if duration is None and SIM_DURATION_ENV in env:
            duration = _float(env[SIM_DURATION_ENV])
        code = int(_float(env.get(SIM_EXIT_CODE_ENV, "0")) or 0)
        if duration is not None:
            task.handle = self.master.timers.call_later(duration, lambda: self._end(task, code))

    def _end(self, task: Task, code: int) -> None:
        with self.master.lock:
            if not task.abandoned and not task.killing:
                self.master.task_exited(task, code)

    def kill(self, task: Task, grace: float) -> None:
        if task.handle is not None:
            task.handle.cancel()

        def killed() -> None:
            with self.master.lock:
                if not task.abandoned:
                    self.master.task_exited(task, -signal.SIGTERM)

        # Not inline: the kill of a group member must not recurse through its siblings.
        self.master.timers.call_later(0.0, killed)

    def kill_agent(self, agent: Agent) -> None:
        for task in agent.tasks.values():
            task.abandoned = True
            if task.handle is not None:
                task.handle.cancel()

    def stop(self) -> None:
        return None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0
