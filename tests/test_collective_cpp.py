"""The collective runtime's C++ unit tests (peloton/collective/csrc/tests, doctest).

They cover the ring algorithms over an in-memory link (ranks as threads) and over socket pairs,
the hierarchical allreduce over in-memory shared slots, and the negotiation and failure agreement
logic. The project's own build makes them (`python setup.py build_cpp_tests`: the extension's
flags plus -Werror); this test builds them, runs them, and fails on any failure or warning.
"""

from __future__ import annotations

import subprocess

from images_support import ROOT, setup_build

BUILD = ROOT / "build" / "cpp-tests"


def test_collective_cpp_unit_tests() -> None:
    setup_build("build_cpp_tests", BUILD)
    run = subprocess.run(
        [str(BUILD / "collective_tests"), "--no-colors=true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"C++ tests failed:\n{run.stdout}\n{run.stderr}"
    assert "Status: SUCCESS!" in run.stdout, run.stdout
    assert "0 failed" in run.stdout, run.stdout
