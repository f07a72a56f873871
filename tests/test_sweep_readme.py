"""README's "Sweeps" runs as written: its shell blocks, read from README.md, run in order in
bash (the first block's SWEEP carried into the second), with the virtualenv active, against a
daemon on the examples' minicluster and pools (README "Using it" starts both). Between the
blocks the test waits for what the text says: the sweep SUCCEEDED, its best trial in the
trainer's best region."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import ROOT, Peloton, run_peloton, wait_for
from test_examples import agents

from peloton.minicluster import Minicluster
from peloton.v1 import sweep_pb2

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])


def blocks(lang: str) -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Sweeps\n", 1)[1].split("\n## ", 1)[0]
    return [
        text
        for kind, text in re.findall(r"^```(\w*)\n(.*?)^```$", section, flags=re.S | re.M)
        if kind == lang
    ]


@pytest.fixture
def peloton(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Peloton]:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent), prepend=":")
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    from daemon import start_minicluster

    mc: Minicluster = start_minicluster(agents(), tmp_path / "cluster")
    p = Peloton(db_url, mc, tmp_path / "peloton")
    for name in ("research", "vision"):
        made = run_peloton("pool", "create", f"examples/pools/{name}.yaml", server=p.proc.address)
        assert made.returncode == 0, made.stderr
    yield p
    p.close()
    mc.stop()


def bash(script: str, server: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PELOTON_")}
    env |= {"PELOTON_SERVER": server, "XDG_CONFIG_HOME": "/nonexistent"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_sweeps_section_runs_as_written(peloton: Peloton) -> None:
    submit, inspect = blocks("sh")
    shown = bash(submit + 'echo "SWEEP=$SWEEP"\n', peloton.proc.address)
    sweep_id = shown.rsplit("SWEEP=", 1)[1].strip()
    assert f"Sweep:         {sweep_id} (lr-sweep)" in shown
    wait_for(
        lambda: peloton.client.get_sweep(sweep_id).state == sweep_pb2.SWEEP_STATE_SUCCEEDED,
        120,
        "the sweep SUCCEEDED",
        interval=0.5,
        state=lambda: peloton.client.list_trials(sweep_id),
    )
    shown = bash(f"SWEEP={sweep_id}\n" + inspect, peloton.proc.address)
    data = json.loads(shown[shown.index("\n{") + 1 :])
    assert data["state"] == "SUCCEEDED" and data["reason"].startswith("best trial ")
    assert "loss 0.1" in data["reason"]
    best = peloton.client.list_trials(sweep_id)[0]
    assert 0.03 <= float(best.params["lr"]) <= 0.3
    assert "TRIAL" in shown and "STOPPED" in shown
    # The Python block is the pattern the example's trainer follows.
    (example,) = blocks("python")
    assert "peloton.report(step=step, loss=loss" in example
    assert (
        "peloton.report(step=step, loss=value)"
        in (ROOT / "examples" / "sweep" / "sweep_train.py").read_text()
    )
