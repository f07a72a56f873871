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
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peloton.minicluster import isolate
from peloton.minicluster.containers import (
    SANDBOX,
    Containerizer,
    LaunchFailed,
    Prepared,
    image_name,
    launch_command,
    remove_scratch,
)
from peloton.minicluster.master import Master, command_user
from peloton.minicluster.model import Agent, Executor, Task

# What says which GPUs a task may use; a task never inherits the agent's.
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
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


def _identity(user: pwd.struct_passwd) -> tuple[int, int, tuple[int, ...]] | None:
    """Who a task of ``user`` runs as (uid, gid, supplementary groups); None if that is the
    agent itself (an agent that is not root runs every task as itself)."""
    if user.pw_uid == os.geteuid():
        return None
    return user.pw_uid, user.pw_gid, tuple(os.getgrouplist(user.pw_name, user.pw_gid))


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
    gid and groups); an agent that is not root can only run tasks as itself. A task of a group
    whose CommandInfo names a user runs as that user instead, as a nested container does, in a
    sandbox chowned to it; a user the agent does not know fails that task as Mesos's launch
    helper does (exit status 1, the reason on its stderr).

    A task whose ContainerInfo names an image runs in a container of it (see
    :mod:`peloton.minicluster.containers`): provisioned on a thread of its own (extracting layers
    takes a while), then started by :mod:`peloton.minicluster.isolate`; it is RUNNING once its
    command was executed. If its container cannot be launched it is FAILED, with the reason as
    Mesos gives it: in a task group, as the default executor reports a nested container that
    failed to launch (the bare message, no reason); a command task as its agent does
    (REASON_CONTAINER_LAUNCH_FAILED, "Failed to launch container: ...").
    """

    def __init__(self, master: Master, containerizer: Containerizer | None = None) -> None:
        self.master = master
        self.containerizer = containerizer or Containerizer(None)
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._launching: set[threading.Thread] = set()

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
        executor.run_as = _identity(user)
        return ""

    def start(self, agent: Agent, task: Task) -> None:
        sandbox = task_sandbox(task)
        assert sandbox is not None and task.executor.directory is not None
        # A task of a group whose CommandInfo names a user runs as that user, as the agent runs
        # a nested container (LAUNCH_NESTED_CONTAINER: the command's user over the executor's),
        # in a sandbox chowned to it.
        user = command_user(task.info) if task.executor.group else ""
        task.run_as = task.executor.run_as
        unknown = False
        if user and user != task.executor.user:
            try:
                task.run_as = _identity(pwd.getpwnam(user))
            except KeyError:
                unknown = True
        run_as = task.run_as
        try:
            sandbox.mkdir(parents=True, exist_ok=True)
            _link_latest(task.executor.directory)
            for path in (sandbox, sandbox / "stdout", sandbox / "stderr"):
                path.touch()
                if run_as is not None and not unknown:
                    os.chown(path, run_as[0], run_as[1])
        except OSError as exc:
            self.master.task_exited(task, None, f"Failed to create the sandbox: {exc}")
            return
        task.sandbox = sandbox
        self.master.agent_update(task, "TASK_STARTING")
        if unknown:
            self._unknown_user(task, sandbox, user)
            return
        if image_name(task.info) is not None:
            self._start_container(agent, task, sandbox)
            return
        argv, executable = launch_command(task.info.get("command") or {}, None)
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

    def _unknown_user(self, task: Task, sandbox: Path, user: str) -> None:
        """A nested container of a user the agent does not have, as Mesos 1.11 runs it: the
        chown of its sandbox only warns, the container is launched (RUNNING), and its launch
        helper, finding no uid for the user, says so on the container's stderr and exits 1,
        which the default executor reports as any exit (TASK_FAILED "Command exited with status
        1"; the rest of the group is killed). The exit comes after the whole group started."""
        with open(sandbox / "stderr", "a") as err:
            err.write(f"Failed to get the uid of user '{user}': not found\n")
        self.master.agent_update(task, "TASK_RUNNING")

        def exited() -> None:
            with self.master.lock:
                if not task.abandoned and not task.terminal:
                    self.master.task_exited(task, 1)

        self.master.timers.call_later(0.0, exited)

    def _env(self, agent: Agent, task: Task, sandbox: Path) -> dict[str, str]:
        # A Mesos agent passes its own environment on, then sets what Mesos sets.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MESOS_") and k not in GPU_VARIABLES
        }
        env.update(_mesos_env(agent, task, str(sandbox)))
        env["MESOS_DIRECTORY"] = str(task.executor.directory)
        env.update(command_env(task.info))
        return env

    def _start_container(self, agent: Agent, task: Task, sandbox: Path) -> None:
        thread = threading.Thread(
            target=self._launch_container,
            args=(agent, task, sandbox),
            name=f"launch-{task.task_id}",
            daemon=True,
        )
        self._launching.add(thread)
        thread.start()

    def _launch_container(self, agent: Agent, task: Task, sandbox: Path) -> None:
        """Provision the task's container, start it, and once its command runs report it
        RUNNING and wait for it (on this thread, outside the master lock but for reports)."""
        assert agent.directory is not None
        try:
            prepared = self.containerizer.prepare(
                task, agent.directory, sandbox, _mesos_env(agent, task, SANDBOX)
            )
        except (LaunchFailed, OSError) as exc:
            message = str(exc) if isinstance(exc, LaunchFailed) else f"Failed to prepare: {exc}"
            with self.master.lock:
                self._launching.discard(threading.current_thread())
                self._launch_failed(task, message)
            return
        read_fd, write_fd = os.pipe()
        try:
            with self.master.lock:
                self._launching.discard(threading.current_thread())
                proc = self._spawn(task, sandbox, prepared, write_fd)
        finally:
            os.close(write_fd)
        with os.fdopen(read_fd, "rb") as errors:
            # End of file alone once the command was executed; else why it was not.
            error = errors.read().decode(errors="replace") if proc is not None else ""
        if proc is None:
            remove_scratch(prepared.scratch)
            return
        if error:
            proc.wait()
            remove_scratch(prepared.scratch)
            with self.master.lock:
                self._procs.pop(proc.pid, None)
                self._launch_failed(task, error)
            return
        with self.master.lock:
            self.master.agent_update(task, "TASK_RUNNING")
        self._wait(task, proc, prepared.scratch)

    def _spawn(
        self, task: Task, sandbox: Path, prepared: Prepared, error_fd: int
    ) -> subprocess.Popen[bytes] | None:
        """Start the isolate program, under the lock: a kill until now is seen here, and one
        from now on reaches it. None if it did not start (reported)."""
        if task.killing or task.abandoned:  # killed (or its agent) while it was provisioned
            if not task.abandoned:
                self.master.task_exited(task, None)
            self._release_executor(task)
            return None
        argv = [sys.executable, "-I", "-S", isolate.__file__, str(prepared.spec_path)]
        try:
            with open(sandbox / "stdout", "ab") as out, open(sandbox / "stderr", "ab") as err:
                proc = subprocess.Popen(
                    [*argv, str(error_fd)],
                    pass_fds=(error_fd,),
                    cwd=sandbox,
                    env={},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
        except OSError as exc:
            self._launch_failed(task, f"Failed to launch the container: {exc}")
            return None
        task.handle, task.pid = proc, proc.pid
        self._procs[proc.pid] = proc
        return proc

    def _launch_failed(self, task: Task, message: str) -> None:
        """Report that the task's container could not be launched (under the lock)."""
        if task.killing:
            self.master.task_exited(task, None)
        elif task.executor.group:
            self.master.agent_update(task, "TASK_FAILED", message)
        else:
            self.master.agent_update(
                task,
                "TASK_FAILED",
                f"Failed to launch container: {message}",
                "REASON_CONTAINER_LAUNCH_FAILED",
                "SOURCE_AGENT",
            )
        self._release_executor(task)

    def _release_executor(self, task: Task) -> None:
        """Once none of its tasks runs, the executor's container (its /dev/shm) goes."""
        if all(t.terminal or t.abandoned for t in task.executor.tasks.values()):
            self.containerizer.release(task.executor)

    def _wait(self, task: Task, proc: subprocess.Popen[bytes], scratch: Path | None = None) -> None:
        returncode = proc.wait()
        # The session may hold children the command left behind: the container dies whole.
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        if scratch is not None:
            remove_scratch(scratch)
        with self.master.lock:
            self._procs.pop(proc.pid, None)
            if not task.abandoned:
                self.master.task_exited(task, returncode)
            self._release_executor(task)

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
        """SIGKILL every task process and reap it; unmount what containers left on the host."""
        with self.master.lock:
            for agent in self.master.agents.values():
                for task in agent.tasks.values():
                    task.abandoned = True
            launching = list(self._launching)
        for thread in launching:  # provisioning: it sees the task abandoned and starts nothing
            thread.join()
        with self.master.lock:
            procs = list(self._procs.values())
        for proc in procs:
            _signal(proc, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.containerizer.release_all()


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if proc.returncode is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)


def _mesos_env(agent: Agent, task: Task, sandbox: str) -> dict[str, str]:
    """What a Mesos agent sets for a task whose sandbox it sees at ``sandbox``."""
    env = {
        "MESOS_SANDBOX": sandbox,
        "MESOS_TASK_ID": task.task_id,
        "MESOS_FRAMEWORK_ID": task.framework_id,
        "MESOS_EXECUTOR_ID": task.executor.executor_id,
        "MESOS_SLAVE_ID": agent.id,
        "MESOS_AGENT_ENDPOINT": f"{agent.ip}:{agent.port}",
        "MESOS_CHECKPOINT": "1",
        "MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD": "5secs",
    }
    if agent.total.scalar("gpus") > 0:
        # Mesos GPU isolation exposes only the task's devices; a task without GPUs sees none.
        # CUDA and the NVIDIA container runtime each read their variable.
        visible = ",".join(str(g) for g in task.gpus)
        env.update(dict.fromkeys(GPU_VARIABLES, visible))
    return env


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
