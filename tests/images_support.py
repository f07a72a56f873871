"""Docker images for tests, built offline in about a second from this machine's own programs.

    from images_support import base_layer, write_test_images

:func:`base_layer` is a root filesystem of ``/bin/sh`` (dash) and a few coreutils with the shared
libraries ``ldd`` lists for them (:func:`peloton.minicluster.hostrootfs.host_rootfs`), and
nothing else: no Python, no peloton. :func:`write_test_images`
writes a registry of images on it (see :data:`IMAGES`).
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from peloton.collective import bundle as runtime_bundle
from peloton.images import write_image
from peloton.minicluster.hostrootfs import IMAGE_PATH, host_rootfs

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "build" / "peloton-runtime"

PROGRAMS = (
    "sh",
    "cat",
    "df",
    "echo",
    "env",
    "grep",
    "id",
    "ls",
    "mkdir",
    "pwd",
    "rm",
    "sleep",
    "tail",
    "test",
    "touch",
    "wc",
)
# What every image of the test registry says about itself (in /etc/image-release).
RELEASE = "test image 1"

# name -> what it is; see write_test_images.
IMAGES = {
    "base:1": "the programs; Env GREETING=image, LAYER=base",
    "layered:1": "base + a layer deleting /etc/doomed (whiteout), making /opt/stuff opaque",
    "entry:1": "base; ENTRYPOINT /bin/echo entry, CMD from-cmd",
    "cmd:1": "base; CMD /bin/echo cmd default (no ENTRYPOINT)",
    "workdir:1": "base; WorkingDir /opt/work",
    "data:1": "one layer: /payload/content.txt (a volume's image)",
}


def base_layer(dest: Path) -> Path:
    """``dest`` filled with PROGRAMS and their libraries, and the files the tests look for."""
    host_rootfs(dest, PROGRAMS)
    for directory in ("usr/bin", "opt/stuff"):
        (dest / directory).mkdir(parents=True)
    (dest / "etc/image-release").write_text(RELEASE + "\n")
    (dest / "etc/doomed").write_text("deleted by the layer above\n")
    (dest / "opt/stuff/old").write_text("hidden by the opaque layer above\n")
    return dest


def whiteout_layer(dest: Path) -> Path:
    """A layer that deletes /etc/doomed, hides /opt/stuff's old content and adds a file."""
    (dest / "etc").mkdir(parents=True)
    (dest / "etc/.wh.doomed").touch()
    stuff = dest / "opt/stuff"
    stuff.mkdir(parents=True)
    (stuff / ".wh..wh..opq").touch()
    (stuff / "new").write_text("from the top layer\n")
    return dest


def write_test_images(registry: Path, scratch: Path) -> Path:
    """Write every image of IMAGES into ``registry`` (as ``NAME.tar``); ``registry``."""
    base = base_layer(scratch / "base")
    top = whiteout_layer(scratch / "whiteouts")
    data = scratch / "data"
    (data / "payload").mkdir(parents=True)
    (data / "payload/content.txt").write_text("from the data image\n")
    env = {"PATH": IMAGE_PATH, "GREETING": "image", "LAYER": "base"}
    write_image(registry / "base:1.tar", "base:1", [base], env=env)
    write_image(registry / "layered:1.tar", "layered:1", [base, top], env=env)
    write_image(
        registry / "entry:1.tar",
        "entry:1",
        [base],
        entrypoint=["/bin/echo", "entry"],
        cmd=["from-cmd"],
        env=env,
    )
    write_image(registry / "cmd:1.tar", "cmd:1", [base], cmd=["/bin/echo", "cmd", "default"])
    write_image(registry / "workdir:1.tar", "workdir:1", [base], env=env, workdir="/opt/work")
    write_image(registry / "data:1.tar", "data:1", [data])
    return registry


@contextmanager
def build_lock() -> Iterator[None]:
    """Held while a test builds in the checkout's build/ (setup.py's C++ builds, ``make
    images``): one build at a time, since the suite's processes side by side (``make test``'s
    pytest-xdist workers) would otherwise write the same objects at once."""
    (ROOT / "build").mkdir(exist_ok=True)
    with (ROOT / "build" / ".tests-build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def setup_build(command: str, build_dir: Path) -> None:
    """Run one of setup.py's C++ build commands (incremental), as ``make`` does; the build's
    output shown if it fails or warns."""
    with build_lock():
        build = subprocess.run(
            [sys.executable, "setup.py", "-q", command, f"--build-dir={build_dir}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=280,
        )
    assert build.returncode == 0, f"{command} failed:\n{build.stdout}\n{build.stderr}"
    assert "warning:" not in build.stderr, build.stderr


def build_bundle() -> Path:
    """The collective runtime bundle, built by the project's own build (``make bundle``); its
    directory."""
    setup_build("build_bundle", BUNDLE)
    return runtime_bundle.locate(BUNDLE)


def write_runtime_image(registry: Path) -> str:
    """The bundle's image in ``registry``, as an operator puts it in an agent's; its name."""
    bundle = build_bundle()
    runtime_bundle.write_bundle_image(bundle, runtime_bundle.image_path(bundle, registry))
    return runtime_bundle.reference(bundle)
