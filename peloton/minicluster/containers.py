"""Image containers on the minicluster's agents, made as the Mesos 1.11 containerizer makes a
task's container from its ``ContainerInfo`` (``type: MESOS`` with ``mesos.image``).

What a task sees, and the Mesos part each follows:

* **rootfs** (docker provisioner, overlay backend; :mod:`peloton.minicluster.images`): the image's
  layers under a writable layer of its own, removed when the task ends.
* **command** (``docker/runtime`` isolator): ``shell: true`` runs ``/bin/sh -c VALUE`` and ignores
  the image's ENTRYPOINT and CMD; ``shell: false`` with a value execs it with the arguments; with
  no value, the image's ENTRYPOINT runs with the arguments in place of its CMD (its CMD when there
  are none), or without an ENTRYPOINT ``CMD[0]`` runs with the arguments (or the rest of CMD).
* **environment**: what the agent sets (``MESOS_*``; ``MESOS_SANDBOX=/mnt/mesos/sandbox``), then
  the image's Env over it, then the CommandInfo's variables; ``PATH`` defaults to the host default
  path. The agent's own environment is not passed in: it describes the host, not the image.
* **working directory**: the image's WorkingDir if set, else the sandbox.
* **mounts** (``filesystem/linux``, ``volume/host_path``, ``volume/image``, ``network/cni``):
  the sandbox at ``/mnt/mesos/sandbox``; volumes, whose relative ``container_path`` is in the
  sandbox: an absolute ``host_path`` (which must exist), a relative one (a directory in the
  sandbox) or an image (its own overlay); RO or RW; the host's ``/etc/hosts``, ``/etc/hostname``
  and ``/etc/resolv.conf`` read-only (a container on the host network).
* **IPC** (``namespaces/ipc``): ``SHARE_PARENT`` uses the executor's /dev/shm: the tmpfs of
  ``shm_size`` MB its ``linux_info`` asks for with ``ipc_mode: PRIVATE`` (one per executor,
  mounted on the agent when its first task needs it and unmounted when its last task ends), else
  the host's; ``PRIVATE`` gives the task an IPC namespace and a /dev/shm of its own (of its
  ``shm_size``); unset, a task with an image gets a /dev/shm of its own. ``shm_size`` without
  ``PRIVATE`` fails the launch. Tasks that share their parent's IPC namespace stay in the agent's:
  the default executor, which would own one, is not a process here.
* **devices** (``filesystem/linux``, ``gpu/nvidia``): full, null, random, tty, urandom, zero, and
  for a task with GPUs ``/dev/nvidiaN`` of its GPUs, ``nvidiactl`` and ``nvidia-uvm(-tools)``,
  where the host has them.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peloton.images import ImageConfig
from peloton.minicluster import isolate
from peloton.minicluster.images import ImageStore, Provisioned, ProvisionError
from peloton.minicluster.model import Executor, Task

if TYPE_CHECKING:
    from peloton.minicluster.isolate import LaunchSpec, Mount

SANDBOX = "/mnt/mesos/sandbox"  # a Mesos agent's default --sandbox_directory
# What a Mesos launcher sets PATH to when the environment has none (os::host_default_path).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_FILES = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf")
GPU_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
SHM_SIZE_ERROR = "Only support specifying the size of /dev/shm when the IPC mode is `PRIVATE`"


class LaunchFailed(Exception):
    """The container cannot be launched; the message is what the task's failure says."""


def image_name(info: Mapping[str, Any]) -> str | None:
    """The Docker image a TaskInfo's (or ExecutorInfo's) container asks for, if any."""
    container = info.get("container")
    mesos = container.get("mesos") if isinstance(container, dict) else None
    image = mesos.get("image") if isinstance(mesos, dict) else None
    if not isinstance(image, dict):
        return None
    docker = image.get("docker")
    name = docker.get("name") if isinstance(docker, dict) else None
    return str(name) if name is not None else ""


def launch_command(command: Mapping[str, Any], config: ImageConfig | None) -> tuple[list[str], str]:
    """(argv, the program) of a CommandInfo, in an image with ``config`` or on the host (None).

    ``shell`` runs ``/bin/sh -c VALUE``; otherwise ``VALUE`` is exec'd with ``arguments`` (which
    hold argv[0]); in an image a command with no value runs the image's ENTRYPOINT or CMD."""
    value = str(command.get("value", ""))
    arguments = [str(a) for a in command.get("arguments") or []]
    if command.get("shell", True):
        return ["/bin/sh", "-c", value], "/bin/sh"
    if value or config is None:
        return arguments or [value], value
    if config.entrypoint:
        argv = [*config.entrypoint, *arguments]
        if not arguments:
            argv += config.cmd
    elif config.cmd:
        argv = [config.cmd[0], *(arguments or config.cmd[1:])]
    else:
        raise LaunchFailed("Failed to determine the launch command: No executable is found")
    return argv, argv[0]


@dataclass
class Prepared:
    """A container ready to start: where its spec is, and its scratch to remove after."""

    spec_path: Path
    scratch: Path


class Containerizer:
    """Makes the image containers of one minicluster's agents (``store`` None: none configured,
    so a task with an image fails as on an agent without ``--image_providers``). Thread-safe:
    :meth:`prepare` extracts layers, so the runner calls it outside the master lock."""

    def __init__(self, store: ImageStore | None) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._shm: dict[Executor, Path] = {}  # the executors' own /dev/shm, mounted

    def prepare(
        self, task: Task, agent_dir: Path, sandbox: Path, env: Mapping[str, str]
    ) -> Prepared:
        """Provision the task's image and volumes and write its launch spec in the agent's
        directory ``agent_dir``; ``env`` is what the agent sets. LaunchFailed if it cannot."""
        store = self._store()
        provisioned = self._provision(store, image_name(task.info) or "")
        info = task.info
        container = info.get("container") or {}
        command = info.get("command") or {}
        argv, program = launch_command(command, provisioned.image.config)
        scratch = agent_dir / "provisioner" / "containers" / uuid.uuid4().hex
        root = _mount(
            str(scratch / "rootfs"),
            layers=[str(p) for p in provisioned.layers],
            upper=str(scratch / "upper"),
            work=str(scratch / "work"),
        )
        shm, shm_size, private_ipc = self._shm_plan(container, task.executor, agent_dir)
        spec: LaunchSpec = {
            "root": root,
            "mounts": [
                _mount(SANDBOX, str(sandbox)),
                *self._volumes(store, container, sandbox, scratch),
                *[_mount(p, p, readonly=True) for p in HOST_FILES if os.path.exists(p)],
            ],
            "argv": argv,
            "executable": program,
            "env": _environment(env, provisioned.image.config, command),
            "cwd": provisioned.image.config.workdir or SANDBOX,
            "empty_dir": str(self._empty_dir(store)),
            "shm": shm,
            "shm_size_mb": shm_size,
            "private_ipc": private_ipc,
            "devices": _devices(task.gpus),
            "user": _user(task),
        }
        for mount in (root, *spec["mounts"]):
            for directory in (mount["upper"], mount["work"]):
                if directory:
                    Path(directory).mkdir(parents=True)
        (scratch / "rootfs").mkdir()
        spec_path = scratch / "launch.spec"
        isolate.write_spec(str(spec_path), spec)
        return Prepared(spec_path, scratch)

    def _shm_plan(
        self, container: Mapping[str, Any], executor: Executor, agent_dir: Path
    ) -> tuple[str, int | None, bool]:
        """(the host directory to bind at /dev/shm, '' for a tmpfs of its own; that tmpfs's size
        in MB; whether the task gets an IPC namespace of its own)."""
        mode = _linux_info(container).get("ipc_mode")
        if _shm_size(container) is not None and mode != "PRIVATE":
            raise LaunchFailed(SHM_SIZE_ERROR)
        if mode == "PRIVATE":
            return "", _shm_size(container), True
        if mode == "SHARE_PARENT":
            return str(self._executor_shm(executor, agent_dir)), None, False
        return "", None, False

    def _executor_shm(self, executor: Executor, agent_dir: Path) -> Path:
        """The /dev/shm the executor's SHARE_PARENT tasks share: its own tmpfs (mounted by the
        first task that needs it) if its IPC is PRIVATE, else the host's."""
        container = executor.info.get("container") or {}
        if not _ipc_private(container):
            return Path("/dev/shm")
        size = _shm_size(container)
        with self._lock:
            path = self._shm.get(executor)
            if path is not None:
                return path
            path = agent_dir / "containers" / executor.run_id / "shm"
            path.mkdir(parents=True, exist_ok=True)
            options = "mode=1777" + (f",size={size}m" if size is not None else "")
            flags = isolate.MS_NOSUID | isolate.MS_NODEV | isolate.MS_STRICTATIME
            try:
                isolate.mount("tmpfs", str(path), "tmpfs", flags, options)
            except isolate.LaunchError as exc:
                raise LaunchFailed(str(exc)) from None
            self._shm[executor] = path
            return path

    def release(self, executor: Executor) -> None:
        """The executor ended: unmount its /dev/shm (if it had one)."""
        with self._lock:
            path = self._shm.pop(executor, None)
        if path is not None:
            isolate.unmount(str(path), isolate.MNT_DETACH)
            path.rmdir()

    def release_all(self) -> None:
        """Unmount every executor's /dev/shm (the minicluster stops)."""
        for executor in list(self._shm):
            self.release(executor)

    def _store(self) -> ImageStore:
        if self.store is None:
            raise LaunchFailed("Unsupported container image type: DOCKER")
        return self.store

    @staticmethod
    def _provision(store: ImageStore, name: str) -> Provisioned:
        try:
            return store.provision(name)
        except ProvisionError as exc:
            raise LaunchFailed(str(exc)) from None

    def _volumes(
        self, store: ImageStore, container: Mapping[str, Any], sandbox: Path, scratch: Path
    ) -> list[Mount]:
        mounts = []
        for i, volume in enumerate(container.get("volumes") or []):
            target = str(volume.get("container_path", ""))
            if not target.startswith("/"):
                target = f"{SANDBOX}/{target}"
            readonly = volume.get("mode", "RW") == "RO"
            if "image" in volume:
                name = image_name({"container": {"mesos": {"image": volume["image"]}}}) or ""
                layers = [str(p) for p in self._provision(store, name).layers]
                # A writable image volume gets a layer of its own over the image, as a rootfs.
                scratch_dir = scratch / "volumes" / str(i)
                upper, work = (
                    ("", "") if readonly else (scratch_dir / "upper", scratch_dir / "work")
                )
                mounts.append(
                    _mount(
                        target, readonly=readonly, layers=layers, upper=str(upper), work=str(work)
                    )
                )
            elif "host_path" in volume:
                source = _host_path(str(volume["host_path"]), sandbox)
                mounts.append(_mount(target, source, readonly))
            else:
                raise LaunchFailed("Only 'host_path' and 'image' volumes are supported here")
        return mounts

    @staticmethod
    def _empty_dir(store: ImageStore) -> Path:
        empty = store.cache / "empty"
        empty.mkdir(parents=True, exist_ok=True)
        return empty


def _mount(
    target: str,
    source: str = "",
    readonly: bool = False,
    *,
    layers: list[str] | None = None,
    upper: str = "",
    work: str = "",
) -> Mount:
    return {
        "target": target,
        "source": source,
        "readonly": readonly,
        "layers": layers or [],
        "upper": upper,
        "work": work,
    }


def remove_scratch(scratch: Path) -> None:
    """Remove a container's rootfs, writable layers and spec after it ended."""
    shutil.rmtree(scratch, ignore_errors=True)


def _host_path(path: str, sandbox: Path) -> str:
    """An absolute host path (which must exist), or a directory in the sandbox (made)."""
    if os.path.isabs(path):
        if not os.path.exists(path):
            raise LaunchFailed(f"Path '{path}' in HOST_PATH volume does not exist")
        return path
    source = sandbox / path
    source.mkdir(parents=True, exist_ok=True)
    return str(source)


def _environment(
    agent_env: Mapping[str, str], config: ImageConfig, command: Mapping[str, Any]
) -> dict[str, str]:
    env = {**agent_env, **config.env}
    environment = command.get("environment") or {}
    for var in environment.get("variables") or []:
        if var.get("type", "VALUE") == "VALUE":
            env[str(var["name"])] = str(var.get("value", ""))
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def _linux_info(container: Mapping[str, Any]) -> Mapping[str, Any]:
    linux = container.get("linux_info")
    return linux if isinstance(linux, dict) else {}


def _ipc_private(container: Mapping[str, Any]) -> bool:
    return _linux_info(container).get("ipc_mode") == "PRIVATE"


def _shm_size(container: Mapping[str, Any]) -> int | None:
    """The size in MB its ``linux_info`` asks its /dev/shm to have (None: the kernel's default,
    half the memory)."""
    size = _linux_info(container).get("shm_size")
    return int(size) if size is not None else None


def _devices(gpus: tuple[int, ...]) -> list[str]:
    if not gpus:
        return []
    wanted = [f"/dev/nvidia{g}" for g in gpus] + list(GPU_CONTROL_DEVICES)
    return [d for d in wanted if os.path.exists(d)]


def _user(task: Task) -> tuple[int, int, list[int]] | None:
    if task.run_as is None:
        return None
    uid, gid, groups = task.run_as
    return uid, gid, list(groups)
