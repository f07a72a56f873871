"""A root filesystem of this machine's own programs and the shared libraries they load: the
smallest image layer that runs them, built offline in a moment (the minicluster's tests and its
container benchmark run images of it)."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from peloton.images import write_image

# The PATH of such an image: its programs are in /bin.
IMAGE_PATH = "/usr/local/bin:/usr/bin:/bin"
# An ldd line that names a library file: "libc.so.6 => /lib/.../libc.so.6 (0x...)", or the loader.
_LIBRARY = re.compile(r"(/\S+) \(0x[0-9a-f]+\)$")


def host_rootfs(dest: Path, programs: Iterable[str]) -> Path:
    """Fill ``dest`` with each of ``programs`` (found on PATH) in ``/bin``, and the libraries
    ``ldd`` lists for them at the paths it names; plus an empty ``/etc`` and a ``/tmp``
    (mode 1777). ``dest``. FileNotFoundError if a program is not installed."""
    bin_dir = dest / "bin"
    bin_dir.mkdir(parents=True)
    libraries: set[str] = set()
    for name in programs:
        found = shutil.which(name)
        if found is None:
            raise FileNotFoundError(f"program '{name}' is not installed")
        program = Path(found).resolve()  # /bin/sh is a link to dash: the image gets dash as sh
        shutil.copy2(program, bin_dir / name)
        libraries.update(_libraries(program))
    for library in libraries:
        target = dest / library.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(library).resolve(), target)
    (dest / "etc").mkdir(exist_ok=True)
    (dest / "tmp").mkdir(exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    return dest


def _libraries(program: Path) -> list[str]:
    out = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=True)
    return [m.group(1) for line in out.stdout.splitlines() if (m := _LIBRARY.search(line))]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m peloton.minicluster.hostrootfs --registry DIR NAME:TAG PROGRAM...``: an image
    of this machine's programs (no Python, no peloton), as ``DIR/NAME:TAG.tar``, for trying task
    containers on the minicluster offline."""
    parser = argparse.ArgumentParser(
        prog="python -m peloton.minicluster.hostrootfs",
        description="Write an image of this machine's programs and their libraries into a "
        "minicluster's --docker-registry directory.",
    )
    parser.add_argument("--registry", type=Path, required=True, help="the registry directory")
    parser.add_argument("reference", help="the image's name, e.g. example:1")
    parser.add_argument("programs", nargs="+", help="programs on PATH, e.g. sh cat ls")
    args = parser.parse_args(argv)
    out = args.registry / f"{args.reference}.tar"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".rootfs-") as scratch:
        try:
            layer = host_rootfs(Path(scratch) / "layer", args.programs)
        except FileNotFoundError as exc:
            parser.exit(1, f"error: {exc}\n")
        write_image(out, args.reference, [layer], env={"PATH": IMAGE_PATH})
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
