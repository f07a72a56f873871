"""`make demo` runs the daemon on embedded SQLite, and the job outlives a daemon restart."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of someone else is gone for our purpose; check its state.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_demo_job_survives_restart_and_leaves_nothing_running() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "peloton.demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    created = re.search(r"job ([0-9a-f-]{36}) created", out.stdout)
    assert created is not None, out.stdout
    job_id = created.group(1)
    # After the restart the same job is shown, and the same request id finds it again.
    after_restart = out.stdout.split("Restart the daemon", 1)[1]
    assert f"Job:       {job_id}" in after_restart
    assert f"job {job_id} already exists (same request id)" in after_restart
    assert f"job {job_id} KILLED" in out.stdout
    pids = [int(p) for p in re.findall(r"daemon pid (\d+)", out.stdout)]
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)
