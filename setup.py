"""Builds peloton.collective._core, the C++17 collective runtime (metadata is in pyproject.toml).

The NCCL path is always compiled and loads libnccl.so.2 and the CUDA runtime with dlopen at run
time, so one build works with or without GPUs. Where the real headers exist (nccl.h from the
nvidia-nccl-cu12/cu13 wheel or NCCL_HOME, cuda_runtime_api.h from CUDA_HOME or /usr/local/cuda)
they are used (PELOTON_HAVE_NCCL_H / PELOTON_HAVE_CUDA_H) so the compiler checks our declarations
against them; otherwise csrc/nccl_api.h spells out the few ABI-stable declarations it needs.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import setup

# Compile the sources in parallel (PELOTON_BUILD_JOBS, default: every core).
ParallelCompile("PELOTON_BUILD_JOBS", default=0).install()

CSRC = Path("peloton/collective/csrc")


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
    extra_compile_args=["-O3", "-Wall", "-Wextra", "-pthread"],
    extra_link_args=["-pthread", "-ldl"],
)

setup(ext_modules=[core])
