"""Builds peloton.collective._core, the C++17 collective runtime (metadata is in pyproject.toml).

The NCCL path is always compiled and loads libnccl.so.2 and the CUDA runtime with dlopen at run
time, so one build works with or without GPUs. Where the real headers exist (nccl.h from the
nvidia-nccl-cu12/cu13 wheel or NCCL_HOME, cuda_runtime_api.h from CUDA_HOME or /usr/local/cuda)
they are used (PELOTON_HAVE_NCCL_H / PELOTON_HAVE_CUDA_H) so the compiler checks our declarations
against them; otherwise csrc/nccl_api.h spells out the few ABI-stable declarations it needs.

`python setup.py build_cpp_tests` builds the runtime's C++ unit tests (csrc/tests, doctest) with
the extension's compiler flags plus -Werror into build/cpp-tests/collective_tests;
tests/test_collective_cpp.py builds and runs them, so `make test` does.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import Command, setup

# Compile the sources in parallel (PELOTON_BUILD_JOBS, default: every core).
ParallelCompile("PELOTON_BUILD_JOBS", default=0).install()

CSRC = Path("peloton/collective/csrc")
CXX_FLAGS = ["-O3", "-Wall", "-Wextra", "-pthread"]


def nccl_include() -> str | None:
    """The directory holding nccl.h: NCCL_HOME, the nvidia-nccl wheel, or the system."""
    candidates = []
    if os.environ.get("NCCL_HOME"):
        candidates.append(Path(os.environ["NCCL_HOME"]) / "include")
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations or [] if spec else []:
        candidates.append(Path(root) / "nccl" / "include")
    candidates.append(Path("/usr/include"))
    return next((str(c) for c in candidates if (c / "nccl.h").is_file()), None)


def cuda_include() -> str | None:
    """The directory holding cuda_runtime_api.h (CUDA_HOME, else /usr/local/cuda)."""
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    return str(home) if (home / "cuda_runtime_api.h").is_file() else None


include_dirs = [str(CSRC)]
macros: list[tuple[str, str | None]] = []
if (cuda := cuda_include()) is not None:
    include_dirs.append(cuda)
    macros.append(("PELOTON_HAVE_CUDA_H", "1"))
    if (nccl := nccl_include()) is not None:
        include_dirs.append(nccl)
        macros.append(("PELOTON_HAVE_NCCL_H", "1"))

core = Pybind11Extension(
    "peloton.collective._core",
    sorted(str(p) for p in CSRC.glob("*.cc")),
    # Headers: rebuild when they change, and ship them in the sdist.
    depends=sorted(str(p) for p in CSRC.glob("*.h")),
    include_dirs=include_dirs,
    define_macros=macros,
    cxx_std=17,
    extra_compile_args=CXX_FLAGS,
    extra_link_args=["-pthread", "-ldl"],
)


class BuildCppTests(Command):
    """Builds the C++ unit tests: the runtime's sources but the binding (module.cc) and NCCL."""

    description = "build the collective runtime's C++ unit tests (build/cpp-tests/collective_tests)"
    user_options = [("build-dir=", None, "where objects and the test binary go")]

    def initialize_options(self) -> None:
        self.build_dir = "build/cpp-tests"

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        out = Path(self.build_dir)
        out.mkdir(parents=True, exist_ok=True)
        cxx = shlex.split(os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++")
        flags = [
            "-std=c++17",
            *CXX_FLAGS,
            "-Werror",
            f"-I{CSRC}",
            # doctest.h is someone else's code: its warnings are not ours to fail on.
            f"-isystem{CSRC / 'tests'}",
        ]
        binding = ("module.cc", "nccl_comm.cc")
        runtime = [p for p in sorted(CSRC.glob("*.cc")) if p.name not in binding]
        sources = runtime + sorted((CSRC / "tests").glob("*.cc"))
        headers = [*CSRC.glob("*.h"), *(CSRC / "tests").glob("*.h")]
        newest_header = max(p.stat().st_mtime for p in headers)

        def compile_one(src: Path) -> Path:
            obj = out / (src.stem + (".test.o" if src.parent.name == "tests" else ".o"))
            # test_main.cc is only doctest's main: it depends on doctest.h alone.
            newest = max(src.stat().st_mtime, newest_header if src.name != "test_main.cc" else 0)
            if not obj.exists() or obj.stat().st_mtime < newest:
                self.announce(f"compiling {src}", level=2)
                subprocess.run([*cxx, *flags, "-c", str(src), "-o", str(obj)], check=True)
            return obj

        jobs = int(os.environ.get("PELOTON_BUILD_JOBS") or 0) or os.cpu_count() or 1
        with ThreadPoolExecutor(jobs) as pool:
            objects = list(pool.map(compile_one, sources))
        binary = out / "collective_tests"
        link = [*cxx, *CXX_FLAGS, *map(str, objects), "-o", str(binary), "-ldl"]
        subprocess.run(link, check=True)
        self.announce(f"built {binary}", level=2)


setup(ext_modules=[core], cmdclass={"build_cpp_tests": BuildCppTests})
