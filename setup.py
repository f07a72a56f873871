"""Builds peloton.collective._core, the C++17 collective runtime (metadata is in pyproject.toml)."""

from __future__ import annotations

from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import setup

# Compile the sources in parallel (PELOTON_BUILD_JOBS, default: every core).
ParallelCompile("PELOTON_BUILD_JOBS", default=0).install()

CSRC = Path("peloton/collective/csrc")

core = Pybind11Extension(
    "peloton.collective._core",
    sorted(str(p) for p in CSRC.glob("*.cc")),
    include_dirs=[str(CSRC)],
    cxx_std=17,
    extra_compile_args=["-O3", "-Wall", "-Wextra", "-pthread"],
    extra_link_args=["-pthread"],
)

setup(ext_modules=[core])
