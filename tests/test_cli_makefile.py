"""``make help`` is true: it lists every target in .PHONY, each of which has a recipe, and it
describes the demo that ``make demo`` runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from peloton import demo

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _help() -> dict[str, str]:
    """Target -> its description (continuation lines joined)."""
    result = _make("-s", "help")
    assert result.returncode == 0, result.stderr
    described: dict[str, str] = {}
    last = ""
    for line in result.stdout.splitlines():
        match = re.match(r"^make (\S+)\s+(.*)$", line)
        if match:
            last = match.group(1)
            described[last] = match.group(2)
        else:
            assert last and line.startswith(" "), line
            described[last] += " " + line.strip()
    return described


def _phony() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    match = re.search(r"^\.PHONY:(.*)$", text, flags=re.MULTILINE)
    assert match
    return set(match.group(1).split())


def test_help_lists_every_phony_target_and_each_has_a_recipe() -> None:
    described = _help()
    assert set(described) | {"help"} == _phony()
    for target in _phony():
        # -n prints the recipe without running it; a target without a rule fails here.
        result = _make("-n", target)
        assert result.returncode == 0, (target, result.stderr)
        assert result.stdout.strip(), f"make {target} has no recipe"


def test_help_describes_the_demo_that_runs() -> None:
    text = _help()["demo"]
    assert f"{demo.WORKERS}-worker gang" in text
    assert demo.DEFAULT_DIR.name in text
    assert "SQLite" in text
    assert "-m peloton.demo" in _make("-n", "demo").stdout
    agents = yaml.safe_load((ROOT / demo.AGENTS_FILE).read_text())["agents"]
    gpus = {re.search(r"gpus:(\d+)", a["resources"]).group(1) for a in agents}  # type: ignore[union-attr]
    assert f"{len(agents)} agents x {gpus.pop()} GPUs" in text
    assert not gpus  # the same on every agent
