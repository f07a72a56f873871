"""The collective runtime bundle: what ``python setup.py build_bundle`` builds (``make bundle``),
for task containers whose image has no peloton, no Python and no C library of its own.

The bundle directory (``build/peloton-runtime``) holds::

    bin/peloton-collective-check      the self-check (--local N, --gang, --env; see its --help)
    lib/libpeloton_collective.so      the runtime behind its C ABI ...
    include/peloton_collective.h      ... declared here
    lib/glibc/                        the loader and C library the bundle's programs run on
    share/examples/allreduce_worker.c a worker in C, with how to build it against the bundle
    VERSION                           the package version

Task containers mount it read-only at ``/opt/peloton`` (:func:`mount_path`), as an image volume
of the image this module writes (``peloton-runtime:VERSION``, a ``docker save`` archive holding
the bundle under ``opt/peloton``), with :func:`task_env` set. Its programs name their loader and
libraries there, so they run in any image; elsewhere (the build directory on this machine)
:func:`host_command` runs them through the bundled loader. setup.py's BuildBundle says why.

A build-time helper: peloton.collective does not import it.

``python -m peloton.collective.bundle [--bundle DIR] [--registry DIR]`` writes the image next to
the bundle (``build/peloton-runtime.tar``) or as ``DIR/peloton-runtime:VERSION.tar`` in a
registry directory, and prints its path.
"""

from __future__ import annotations

import argparse
import shutil
import struct
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from peloton.images import write_image

IMAGE_REPOSITORY = "peloton-runtime"
CHECK = "peloton-collective-check"
LIBRARY = "libpeloton_collective.so"
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "build" / "peloton-runtime"
_PT_INTERP = 3


class BundleError(Exception):
    """No built bundle where one was expected, or a program in it that names no loader."""


def locate(path: Path | None = None) -> Path:
    """The bundle directory ``path`` (default: the build's, DEFAULT_DIR), once it holds a built
    bundle; BundleError naming what is missing otherwise."""
    bundle = path if path is not None else DEFAULT_DIR
    wanted = [Path("VERSION"), Path("bin") / CHECK, Path("lib") / LIBRARY]
    missing = [str(p) for p in wanted if not (bundle / p).is_file()]
    if missing:
        raise BundleError(
            f"no runtime bundle in {bundle} (missing {', '.join(missing)}): run `make bundle`"
        )
    return bundle


def version(bundle: Path) -> str:
    """The bundle's version (the peloton package's when it was built)."""
    return (bundle / "VERSION").read_text().strip()


def reference(bundle: Path) -> str:
    """The bundle's image reference: ``peloton-runtime:VERSION``."""
    return f"{IMAGE_REPOSITORY}:{version(bundle)}"


def interpreter(program: Path) -> PurePosixPath:
    """The ELF interpreter (PT_INTERP) that the 64-bit ELF ``program`` names."""
    data = program.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise BundleError(f"{program} is not a 64-bit ELF file")
    order = "<" if data[5] == 1 else ">"
    (phoff,) = struct.unpack_from(order + "Q", data, 0x20)
    phentsize, phnum = struct.unpack_from(order + "HH", data, 0x36)
    for i in range(phnum):
        kind, _, offset, _, _, size = struct.unpack_from(
            order + "IIQQQQ", data, phoff + i * phentsize
        )
        if kind == _PT_INTERP:
            return PurePosixPath(data[offset : offset + size].rstrip(b"\0").decode())
    raise BundleError(f"{program} names no ELF interpreter (a static program?)")


def mount_path(bundle: Path) -> PurePosixPath:
    """Where task containers must mount the bundle: the build linked its programs' loader there
    (``MOUNT/lib/glibc/ld-linux-*``)."""
    return interpreter(bundle / "bin" / CHECK).parents[2]


def host_command(bundle: Path, program: str = CHECK) -> list[str]:
    """The command that runs the bundle's ``program`` from ``bundle`` itself, wherever it is: the
    bundled loader, then the program (its libraries are found relative to it)."""
    mount = mount_path(bundle)
    loader = interpreter(bundle / "bin" / program)
    return [str(bundle / loader.relative_to(mount)), str(bundle / "bin" / program)]


def task_env(bundle: Path) -> dict[str, str]:
    """What a task that uses the mounted bundle needs in its environment: the programs on PATH
    and the runtime library (only it: the bundle's C library is in lib/glibc, away from the
    image's programs) on LD_LIBRARY_PATH."""
    mount = mount_path(bundle)
    return {"PATH": f"{mount}/bin", "LD_LIBRARY_PATH": f"{mount}/lib"}


def image_path(bundle: Path, registry: Path | None = None) -> Path:
    """Where the bundle's image goes: ``REGISTRY/peloton-runtime:VERSION.tar`` (a registry
    directory as Mesos' local puller reads it), else beside the bundle (``BUNDLE.tar``)."""
    if registry is not None:
        return registry / f"{reference(bundle)}.tar"
    return bundle.with_name(f"{bundle.name}.tar")


def write_bundle_image(bundle: Path, out: Path) -> Path:
    """Writes the image ``peloton-runtime:VERSION`` to ``out``: one layer holding the bundle at
    its root, since an image volume (Mesos's ``volume/image``) mounts an image's root at the
    volume's path. A link ``opt/peloton -> ..`` makes the programs' loader path resolve when the
    image runs by itself too (its entrypoint is the self-check). Returns ``out``."""
    mount = mount_path(bundle)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".bundle-layer-") as scratch:
        layer = Path(scratch) / "layer"
        shutil.copytree(bundle, layer, symlinks=True)
        link = layer / mount.relative_to("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(*[".."] * (len(link.relative_to(layer).parts) - 1)))
        write_image(
            out,
            reference(bundle),
            [layer],
            entrypoint=[f"{mount}/bin/{CHECK}"],
            env=task_env(bundle),
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m peloton.collective.bundle",
        description="Write the collective runtime bundle's image (a docker save archive).",
    )
    parser.add_argument("--bundle", type=Path, help=f"the bundle directory (default {DEFAULT_DIR})")
    parser.add_argument(
        "--registry", type=Path, help="a registry directory: write DIR/peloton-runtime:VERSION.tar"
    )
    args = parser.parse_args(argv)
    try:
        bundle = locate(args.bundle)
        print(write_bundle_image(bundle, image_path(bundle, args.registry)))
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
