"""The in-container launch of an image task, as ``mesos-containerizer launch`` does it.

The agent starts this file as a program (``python -I -S isolate.py SPEC ERRFD``: standard library
only, so that the start costs no imports) in the task's own session, with the task's stdout and
stderr. It reads the :class:`LaunchSpec` the agent wrote (:func:`write_spec`), then:

1. enters a new mount namespace (and a new IPC namespace when the task's IPC is private), and
   makes every mount in it private, so nothing it mounts is seen by the host or leaks: the
   mounts die with the namespace when the task's last process ends;
2. mounts the image's layers as an overlay at the rootfs, pivots into it (the old root parked
   on a tmpfs at ``/tmp``, as Mesos does), then mounts, with the old root as the source of host
   paths: ``/proc``, ``/sys`` (read-only), a tmpfs ``/dev`` holding copies of the standard device
   nodes and of the task's GPU devices, ``/dev/pts`` and ``/dev/shm``, and the spec's bind and
   overlay mounts (the sandbox at ``/mnt/mesos/sandbox``, volumes, the host's ``/etc/hosts``...);
3. detaches the old root, changes to the working directory, to the task's user, and executes
   the command with the task's environment (the program found on the environment's ``PATH``).

The error pipe ``ERRFD`` is closed on exec: the agent reads end-of-file alone when the command
started, or the reason it could not (one line), after which this exits with status 127.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import stat
import sys

# As typing.TYPE_CHECKING (which mypy takes this for), without importing typing: this program's
# start imports nothing it can spare.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypedDict

    class Mount(TypedDict):
        """A mount in the container at ``target``: the host path ``source`` bound there, or
        (when ``layers`` is set) an overlay of those layers (bottom first), writable when
        ``upper`` and ``work`` are set."""

        target: str
        source: str
        readonly: bool
        layers: list[str]
        upper: str
        work: str

    class LaunchSpec(TypedDict):
        """What :func:`launch` does; host paths are absolute."""

        root: Mount  # the rootfs: an overlay mounted at its (empty, host) target directory
        mounts: list[Mount]
        argv: list[str]
        executable: str
        env: dict[str, str]
        cwd: str
        empty_dir: str  # an empty directory, the bottom of a read-only overlay
        shm: str  # host directory to bind at /dev/shm; "" for a tmpfs of its own
        shm_size_mb: int | None
        private_ipc: bool
        devices: list[str]  # host device nodes besides the standard ones
        user: tuple[int, int, list[int]] | None  # uid, gid, groups to run as; None: as is


CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_STRICTATIME = 0x1000000
MNT_DETACH = 0x2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
# The devices every container gets, copied from the host's (Mesos: makeStandardDevices).
STANDARD_DEVICES = ("full", "null", "random", "tty", "urandom", "zero")
_DEV_LINKS = (
    ("/proc/self/fd", "fd"),
    ("/proc/self/fd/0", "stdin"),
    ("/proc/self/fd/1", "stdout"),
    ("/proc/self/fd/2", "stderr"),
    ("pts/ptmx", "ptmx"),
)
OLD_ROOT = "/tmp/.old_root"  # where the host's root is while the container's mounts are made


def write_spec(path: str, spec: LaunchSpec) -> None:
    """Write ``spec`` where this program reads it (marshal: the same interpreter reads it, and
    loading it costs no import)."""
    with open(path, "wb") as out:
        marshal.dump(dict(spec), out)


def _read_spec(path: str) -> LaunchSpec:
    with open(path, "rb") as data:
        spec: LaunchSpec = marshal.load(data)
    return spec


class LaunchError(Exception):
    """Why the container could not be started (what the task's failure says)."""


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise LaunchError(f"{what}: {os.strerror(errno)}")


def mount(source: str, target: str, fstype: str, flags: int, data: str = "") -> None:
    """mount(2); LaunchError naming both paths and the reason if it fails."""
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode(),
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"Failed to mount '{source}' at '{target}'",
    )


def unmount(target: str, flags: int = 0) -> None:
    """umount2(2); LaunchError if it fails."""
    _check(_libc.umount2(target.encode(), flags), f"Failed to unmount '{target}'")


def _enter_namespaces(private_ipc: bool) -> None:
    flags = CLONE_NEWNS | (CLONE_NEWIPC if private_ipc else 0)
    _check(_libc.unshare(flags), "Failed to enter new namespaces")
    # Nothing mounted from here on propagates back to the host.
    _check(
        _libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None),
        "Failed to make the mounts private",
    )


def _overlay(layered: Mount, target: str, empty_dir: str, host: str = "") -> None:
    """Mount the overlay ``layered`` at ``target``; host paths are read under ``host``.

    Lower directories are named relative to their common parent (the layer cache): the mount
    options fit in one page, so short names let an image have many layers."""
    lowers = [host + p for p in reversed(layered["layers"])]  # overlay lists the top layer first
    if not layered["upper"]:
        lowers.append(host + empty_dir)  # a read-only overlay needs two lower directories
    base = os.path.commonpath(lowers)
    options = "lowerdir=" + ":".join(os.path.relpath(p, base) for p in lowers)
    if layered["upper"]:
        options += f",upperdir={host}{layered['upper']},workdir={host}{layered['work']}"
    cwd = os.getcwd()
    os.chdir(base)
    try:
        mount("overlay", target, "overlay", MS_RDONLY if layered["readonly"] else 0, options)
    finally:
        os.chdir(cwd)


def _pivot(root: str) -> None:
    """Make ``root`` the root, the old one at OLD_ROOT (on a tmpfs over the image's /tmp)."""
    tmp = os.path.join(root, "tmp")
    os.makedirs(tmp, exist_ok=True)
    mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777")
    old = root + OLD_ROOT
    os.mkdir(old)
    machine = os.uname().machine
    number = _PIVOT_ROOT.get(machine)
    if number is None:
        raise LaunchError(f"pivot_root: unknown machine '{machine}'")
    os.chdir(root)
    _check(_libc.syscall(number, b".", old.encode()), f"Failed to pivot to '{root}'")
    os.chdir("/")


def _mount_point(target: str, source: str) -> None:
    """Create ``target`` for a bind of ``source``: a directory, or an empty file for a file."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if not os.path.exists(target):
        with open(target, "a"):
            pass


def _bind(bind: Mount) -> None:
    source = OLD_ROOT + bind["source"]
    _mount_point(bind["target"], source)
    mount(source, bind["target"], "", MS_BIND | MS_REC)
    if bind["readonly"]:
        mount("", bind["target"], "", MS_BIND | MS_REMOUNT | MS_RDONLY)


def _dev(spec: LaunchSpec) -> None:
    """A tmpfs /dev with the standard devices and the task's, /dev/pts and /dev/shm."""
    os.makedirs("/dev", exist_ok=True)
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC | MS_STRICTATIME, "mode=755")
    for device in [f"/dev/{name}" for name in STANDARD_DEVICES] + spec["devices"]:
        info = os.stat(OLD_ROOT + device)
        os.makedirs(os.path.dirname(device), exist_ok=True)
        os.mknod(device, info.st_mode, info.st_rdev)
        os.chmod(device, stat.S_IMODE(info.st_mode))
    for source, name in _DEV_LINKS:
        os.symlink(source, f"/dev/{name}")
    os.mkdir("/dev/pts")
    mount(
        "devpts",
        "/dev/pts",
        "devpts",
        MS_NOSUID | MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620,gid=5",
    )
    os.mkdir("/dev/shm")
    if spec["shm"]:
        mount(OLD_ROOT + spec["shm"], "/dev/shm", "", MS_BIND)
    else:
        size = f",size={spec['shm_size_mb']}m" if spec["shm_size_mb"] is not None else ""
        mount(
            "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_STRICTATIME, "mode=1777" + size
        )


def launch(spec: LaunchSpec) -> None:
    """Set the container up and execute its command; raises LaunchError if it cannot."""
    _enter_namespaces(spec["private_ipc"])
    root = spec["root"]["target"]
    _overlay(spec["root"], root, spec["empty_dir"])
    _pivot(root)
    os.makedirs("/proc", exist_ok=True)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NOEXEC | MS_NODEV)
    os.makedirs("/sys", exist_ok=True)
    mount("sysfs", "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NOEXEC | MS_NODEV)
    _dev(spec)
    for entry in spec["mounts"]:
        if entry["layers"]:
            os.makedirs(entry["target"], exist_ok=True)
            _overlay(entry, entry["target"], spec["empty_dir"], OLD_ROOT)
        else:
            _bind(entry)
    unmount(OLD_ROOT, MNT_DETACH)
    os.rmdir(OLD_ROOT)
    unmount("/tmp")
    _exec(spec)


def _exec(spec: LaunchSpec) -> None:
    try:
        # As Mesos: an image's WORKDIR that its rootfs lacks is made (owned by root).
        os.makedirs(spec["cwd"], exist_ok=True)
        os.chdir(spec["cwd"])
    except OSError as exc:
        raise LaunchError(f"Failed to chdir into '{spec['cwd']}': {exc.strerror}") from None
    if spec["user"] is not None:
        uid, gid, groups = spec["user"]
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
    try:
        os.execvpe(spec["executable"], spec["argv"], spec["env"])
    except OSError as exc:
        raise LaunchError(f"Failed to execute '{spec['executable']}': {exc.strerror}") from None


def main(argv: list[str]) -> int:
    """``isolate.py SPEC ERRFD``: launch, or write why not to ERRFD and return 127."""
    spec_path, error_fd = argv[1], int(argv[2])
    os.set_inheritable(error_fd, False)  # closed by exec: end-of-file tells the agent it ran
    try:
        launch(_read_spec(spec_path))
    except Exception as exc:  # whatever stops the launch must reach the agent
        message = str(exc) if isinstance(exc, LaunchError) else _os_error(exc)
        os.write(error_fd, message.encode()[:4000])
        sys.stderr.write(message + "\n")
    return 127


def _os_error(exc: Exception) -> str:
    if isinstance(exc, OSError):
        where = f" '{exc.filename}'" if exc.filename else ""
        return f"Failed to set up the container:{where} {exc.strerror}"
    return f"Failed to set up the container: {exc!r}"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
