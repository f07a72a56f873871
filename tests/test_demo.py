"""`make demo`: a 4-worker gang trains on a minicluster and ends with the one-process result, and
the demo leaves nothing running."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from daemon import wait_for

from peloton import demo_train

ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of someone else is gone for our purpose; check its state.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def one_process() -> demo_train.Result:
    x, y = demo_train.make_data()
    return demo_train.train(x, y, lambda v: v)


def test_training_converges_in_one_process() -> None:
    x, y = demo_train.make_data()
    losses: list[float] = []
    result = demo_train.train(x, y, lambda v: v, on_step=lambda _s, loss, _l: losses.append(loss))
    assert losses[0] == pytest.approx(np.log(2))  # zero weights: p = 1/2 everywhere
    assert losses == sorted(losses, reverse=True)
    assert result.loss == losses[-1] < 0.35
    accuracy = np.mean(((np.hstack([x, np.ones((len(x), 1))]) @ result.weights) > 0) == (y > 0.5))
    assert accuracy > 0.9


def test_equal_shards_average_to_the_whole_gradient() -> None:
    # Four "ranks" stepped in lockstep by hand: averaging their [loss, gradient] vectors is what
    # allreduce(op="average") does, and must give the one-process run.
    x, y = demo_train.make_data()
    shards = [demo_train.shard(x, y, r, 4) for r in range(4)]
    w = np.zeros(demo_train.FEATURES + 1)
    for _ in range(demo_train.STEPS):
        parts = [demo_train.loss_and_grad(w, xs, ys) for xs, ys in shards]
        w = w - demo_train.LEARNING_RATE * np.mean([g for _, g in parts], axis=0)
    np.testing.assert_allclose(w, one_process().weights, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="equal shards"):
        demo_train.shard(x[:10], y[:10], 0, 4)


def test_demo_trains_on_a_gang_and_leaves_nothing_running(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    out = subprocess.run(
        [sys.executable, "-m", "peloton.demo", "--dir", str(demo_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    created = re.search(r"job ([0-9a-f-]{36}) created", out.stdout)
    assert created is not None, out.stdout
    job_id = created.group(1)
    assert re.search(r"\] job SUCCEEDED\n", out.stdout), out.stdout
    assert f"Job {job_id} SUCCEEDED: 4 workers" in out.stdout
    # Every rank's progress was shown with where it ran; the gang spans both racks.
    for rank in range(4):
        assert re.search(rf"rank {rank} SUCCEEDED on gpu-r\d-1 \(rack r\d\): step 300", out.stdout)
    assert "(rack r1)" in out.stdout and "(rack r2)" in out.stdout
    # The web console's address, the job's page, and the gang on its GPUs as the console drew it.
    console = re.search(r"web console: (http://127\.0\.0\.1:\d+)\n", out.stdout)
    assert console is not None, out.stdout
    assert f"console: {console.group(1)}/#/jobs/{job_id}" in out.stdout
    assert re.search(r"the gang holds gpu-r\d-1 GPUs \d,\d, gpu-r\d-1 GPUs \d,\d\n", out.stdout)
    # The commands it shows are the real CLI's output.
    for shown in ("peloton pool tree", "peloton host list", "peloton task logs", "/metrics"):
        assert shown in out.stdout
    assert "gpu_model=A100,rack=r1" in out.stdout

    # The 4-worker result is the one-process result on the same data.
    expected = one_process()
    for rank in range(4):
        got = json.loads((demo_dir / "out" / f"rank-{rank}.json").read_text())
        assert (got["rank"], got["size"]) == (rank, 4)
        np.testing.assert_allclose(got["weights"], expected.weights, rtol=1e-6, atol=1e-9)
        assert got["loss"] == pytest.approx(expected.loss, rel=1e-9)

    pids = [int(p) for p in re.findall(r"(?:daemon|minicluster) pid (\d+):", out.stdout)]
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)
    # The workers ran as children of the minicluster, which kills them on stop; none remain.
    assert not any(_alive(int(p)) for p in _worker_pids(demo_dir))


def _worker_pids(demo_dir: Path) -> list[str]:
    found = subprocess.run(
        ["pgrep", "-f", f"peloton.demo_train --out {demo_dir / 'out'}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.split()


def test_ctrl_c_during_the_run_leaves_nothing_running(tmp_path: Path) -> None:
    # Its own session, so SIGINT to the group reaches the demo and its children as a terminal's
    # Ctrl-C would.
    proc = subprocess.Popen(
        [sys.executable, "-m", "peloton.demo", "--dir", str(tmp_path / "demo")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if re.match(r"job \S+ created", line):
                break
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = "".join(lines) + rest
    assert proc.returncode == 130, output
    assert "interrupted; nothing is left running" in output
    assert "Traceback" not in output
    pids = [int(p) for p in re.findall(r"(?:daemon|minicluster) pid (\d+):", output)]
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)
    # The workers were SIGKILLed with their process group; a killed process still runs until
    # the kernel schedules its exit, which on a loaded machine is not instant.
    wait_for(
        lambda: not [p for p in _worker_pids(tmp_path / "demo") if _alive(int(p))],
        10,
        "the killed workers to be gone",
        state=lambda: _worker_pids(tmp_path / "demo"),
    )
