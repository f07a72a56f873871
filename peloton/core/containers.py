"""Task containers: the image a task runs in, its volumes and /dev/shm, and peloton's runtime.

A task with ``task.container`` runs in a root filesystem made from a Docker image by the agent's
Mesos containerizer (no Docker daemon), inside the task group of the gang's default executor, so
the management code (the executor) and the user's image stay apart. This module holds what every
component agrees on: the rules of a valid :class:`ContainerSpec` (validation names the field),
Docker image references, the paths peloton reserves inside a container, and
:class:`ContainerLaunch`, the container part of one launch, from which the host manager writes
Mesos's ContainerInfo. Pure: no I/O.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from peloton import __version__
from peloton.errors import InvalidArgument
from peloton.v1 import job_pb2

# Where the agent mounts the task's sandbox in an image container (Mesos's --sandbox_directory).
SANDBOX_PATH = "/mnt/mesos/sandbox"
# Where runtime "peloton" mounts the collective runtime bundle, read-only.
RUNTIME_DIR = "/opt/peloton"
RUNTIME_DIR_ENV = "PELOTON_RUNTIME_DIR"
RUNTIMES = ("peloton",)
# The bundle image agents must hold (daemon option runtime_image), named after this release.
DEFAULT_RUNTIME_IMAGE = f"peloton-runtime:{__version__}"

ENTRYPOINTS = ("shell", "exec", "image")
MODES = ("rw", "ro")
MAX_VOLUMES = 32
MAX_ARGS = 256
MAX_ARG = 32 * 1024
MAX_PATH = 1024
MAX_SHM_MB = 1024 * 1024
# Docker's limit on a repository name, domain included.
MAX_IMAGE_NAME = 255

# Kernel file systems and the containerizer's own mounts: a volume there (or above them, hiding
# them) would break the container.
_KERNEL_PATHS = ("/proc", "/sys", "/dev")
_MANAGED_PATHS = (SANDBOX_PATH, RUNTIME_DIR)

# Docker's reference grammar (distribution/reference): lower-case path components joined by
# '.', '_', '__' or dashes; an optional registry domain with port; a tag; a content digest.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (
    r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
    r"(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?"
)
_PATH_TAG_DIGEST = (
    rf"(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$"
)
_WITH_DOMAIN_RE = re.compile(rf"^(?P<domain>{_DOMAIN})/{_PATH_TAG_DIGEST}")
_WITHOUT_DOMAIN_RE = re.compile(rf"^{_PATH_TAG_DIGEST}")


@dataclass(frozen=True)
class ImageReference:
    """A parsed Docker image reference: ``[domain/]path[:tag][@digest]``."""

    domain: str
    path: str
    tag: str
    digest: str

    @property
    def repository(self) -> str:
        """The name without tag and digest, domain included."""
        return f"{self.domain}/{self.path}" if self.domain else self.path

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.repository}{tag}{digest}"


def parse_image(text: str) -> ImageReference:
    """``text`` as an image reference; ValueError saying what is wrong. As Docker reads a
    reference, the first component is a registry domain only if it has a '.' or ':' or is
    ``localhost`` (``team/trainer`` is a path on the default registry)."""
    if not text:
        raise ValueError("is empty")
    if text != text.strip() or any(c.isspace() for c in text):
        raise ValueError(f"{text!r} holds whitespace")
    first, _, rest = text.partition("/")
    has_domain = bool(rest) and ("." in first or ":" in first or first == "localhost")
    match = (_WITH_DOMAIN_RE if has_domain else _WITHOUT_DOMAIN_RE).match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a Docker image reference such as team/trainer:1.0 or "
            "registry.example.com:5000/team/trainer@sha256:<hex> (names are lower case)"
        )
    domain = match["domain"] if has_domain else ""
    ref = ImageReference(domain, match["path"], match["tag"] or "", match["digest"] or "")
    if len(ref.repository) > MAX_IMAGE_NAME:
        raise ValueError(f"name is longer than {MAX_IMAGE_NAME} characters")
    return ref


@dataclass(frozen=True)
class Mount:
    """One volume of a container: a host directory or an image's files at ``container_path``."""

    container_path: str
    host_path: str = ""
    image: str = ""
    read_only: bool = False


@dataclass(frozen=True)
class ContainerLaunch:
    """The container of one launched task, defaults resolved.

    ``entrypoint`` is one of :data:`ENTRYPOINTS`; ``runtime`` is "peloton" (mount the runtime
    bundle at :data:`RUNTIME_DIR`) or empty; ``shm_mb`` is the task's share of the /dev/shm its
    executor's container owns.
    """

    image: str
    entrypoint: str
    args: tuple[str, ...]
    mounts: tuple[Mount, ...]
    shm_mb: int
    runtime: str = ""


def container_launch(task: job_pb2.TaskSpec) -> ContainerLaunch | None:
    """The container a task of this (valid) spec runs in; None for a task without one."""
    if not task.HasField("container"):
        return None
    c = task.container
    return ContainerLaunch(
        image=c.image,
        entrypoint=c.entrypoint or ENTRYPOINTS[0],
        args=tuple(c.args),
        mounts=tuple(
            Mount(
                container_path=v.container_path,
                host_path=v.host_path,
                image=v.image,
                read_only=(v.mode or ("ro" if v.image else "rw")) == "ro",
            )
            for v in c.volumes
        ),
        shm_mb=c.shm_mb or default_shm_mb(task.resources.mem_mb),
        runtime=c.runtime,
    )


def default_shm_mb(mem_mb: float) -> int:
    """Half the task's memory (at least 1 MiB): Docker's 64 MiB default is too small for NCCL."""
    return max(1, int(mem_mb // 2))


# ---------------------------------------------------------------------------- validation


def check_container(task: job_pb2.TaskSpec) -> None:
    """Raise InvalidArgument naming the first field of ``task.container`` (and the command it
    governs) that breaks a rule."""
    c = task.container
    if not c.image:
        raise InvalidArgument("task.container.image", "is required")
    _check_image("task.container.image", c.image)
    entrypoint = c.entrypoint or ENTRYPOINTS[0]
    if entrypoint not in ENTRYPOINTS:
        raise InvalidArgument(
            "task.container.entrypoint",
            f"unknown entrypoint {c.entrypoint!r}; use {', '.join(ENTRYPOINTS)}",
        )
    _check_command(task.command, entrypoint)
    _check_args(c.args, entrypoint)
    if c.runtime and c.runtime not in RUNTIMES:
        raise InvalidArgument(
            "task.container.runtime", f"unknown runtime {c.runtime!r}; use {' or '.join(RUNTIMES)}"
        )
    if c.shm_mb > min(task.resources.mem_mb, MAX_SHM_MB):
        raise InvalidArgument(
            "task.container.shm_mb",
            f"is {c.shm_mb} MiB, more than the task's memory "
            f"(task.resources.mem_mb {task.resources.mem_mb:g})",
        )
    _check_volumes(c.volumes)


def runs_in_shell(container: ContainerLaunch | None) -> bool:
    """Whether a task's command runs through ``/bin/sh -c``: without a container, or with the
    "shell" entrypoint ("exec" and "image" start a program with no shell in between)."""
    return container is None or container.entrypoint == "shell"


def needs_command(task: job_pb2.TaskSpec) -> bool:
    """Whether the task must name a command: every task but one running its image's ENTRYPOINT."""
    return not (task.HasField("container") and task.container.entrypoint == "image")


def _check_image(field: str, image: str) -> None:
    try:
        parse_image(image)
    except ValueError as exc:
        raise InvalidArgument(field, str(exc)) from None


def _check_command(command: str, entrypoint: str) -> None:
    if entrypoint == "image" and command:
        raise InvalidArgument(
            "task.command",
            'must be empty with container.entrypoint "image" (the image\'s ENTRYPOINT runs; '
            "give its arguments in container.args)",
        )
    if entrypoint == "exec" and any(c.isspace() for c in command.strip()):
        raise InvalidArgument(
            "task.command",
            'with container.entrypoint "exec" is one program path; give its arguments in '
            "container.args",
        )


def _check_args(args: Sequence[str], entrypoint: str) -> None:
    if args and entrypoint == "shell":
        raise InvalidArgument(
            "task.container.args",
            'are not allowed with entrypoint "shell" (put them in task.command)',
        )
    if len(args) > MAX_ARGS:
        raise InvalidArgument("task.container.args", f"at most {MAX_ARGS} arguments")
    for i, arg in enumerate(args):
        if len(arg) > MAX_ARG:
            raise InvalidArgument(f"task.container.args[{i}]", f"is longer than {MAX_ARG} bytes")
        if "\0" in arg:
            raise InvalidArgument(f"task.container.args[{i}]", "holds a NUL character")


def _check_volumes(volumes: Sequence[job_pb2.Volume]) -> None:
    seen: list[tuple[str, int]] = []
    if len(volumes) > MAX_VOLUMES:
        raise InvalidArgument("task.container.volumes", f"at most {MAX_VOLUMES} volumes")
    for i, v in enumerate(volumes):
        field = f"task.container.volumes[{i}]"
        _check_container_path(f"{field}.container_path", v.container_path)
        _check_source(field, v)
        for path, j in seen:
            if _overlaps(path, v.container_path):
                raise InvalidArgument(
                    f"{field}.container_path",
                    f"{v.container_path} overlaps task.container.volumes[{j}] ({path}); "
                    "mount each directory once",
                )
        seen.append((v.container_path, i))


def _check_container_path(field: str, path: str) -> None:
    _check_absolute(field, path)
    if path == "/":
        raise InvalidArgument(field, "must not be / (the image is the root file system)")
    for reserved in (*_KERNEL_PATHS, *_MANAGED_PATHS):
        if _overlaps(path, reserved):
            raise InvalidArgument(
                field, f"{path} is reserved: it is or holds {reserved}, which the agent mounts"
            )


def _check_source(field: str, v: job_pb2.Volume) -> None:
    if bool(v.host_path) == bool(v.image):
        raise InvalidArgument(field, "needs exactly one source: host_path or image")
    if v.host_path:
        _check_absolute(f"{field}.host_path", v.host_path)
    else:
        _check_image(f"{field}.image", v.image)
    if v.mode and v.mode not in MODES:
        raise InvalidArgument(f"{field}.mode", f"unknown mode {v.mode!r}; use rw or ro")
    if v.image and v.mode == "rw":
        raise InvalidArgument(f"{field}.mode", "an image volume is read-only; use ro")


def _check_absolute(field: str, path: str) -> None:
    if len(path) > MAX_PATH:
        raise InvalidArgument(field, f"is longer than {MAX_PATH} characters")
    if not path.startswith("/"):
        raise InvalidArgument(field, f"{path!r} must be an absolute path")
    if "\0" in path or posixpath.normpath(path) != path or path.startswith("//"):
        raise InvalidArgument(
            field, f"{path!r} must be a plain path (no '..', '.', '//' or trailing '/')"
        )


def _overlaps(a: str, b: str) -> bool:
    """Whether one of two absolute paths is the other or lies under it."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")
