"""A root filesystem of this machine's own programs and the shared libraries they load: the
smallest image layer that runs them, built offline in a moment (the minicluster's tests and its
container benchmark run images of it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

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
