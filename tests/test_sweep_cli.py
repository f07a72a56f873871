"""``peloton sweep`` against a real in-process daemon (no Mesos): submit from YAML, list, get,
trials and kill, in tables and JSON; bad input is one ``error:`` line naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon import address, in_process_server, run_peloton, wait_for

from peloton.server import Server

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])

SWEEP = """
name: cli-sweep
trial:
  pool: /research/vision
  instances: 1
  task: {command: "train --lr {lr} --opt {opt}", resources: {cpu: 1, mem_mb: 64, gpu: 1}}
space:
  lr: {log_uniform: [0.001, 0.1]}
  opt: {choice: [sgd, adam]}
objective: {metric: accuracy, maximize: true}
algorithm: grid
grid_points: 2
max_trials: 10
parallel_trials: 2
"""


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    with in_process_server(db_url, tmp_path / "data") as s:
        yield s


def cli(server: Server, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    done = run_peloton(*args, server=address(server.grpc_port), input_text=stdin)
    return done.returncode, done.stdout, done.stderr


def test_submit_list_get_trials_and_kill(server: Server) -> None:
    code, out, err = cli(server, "sweep", "submit", "-q", "-", stdin=SWEEP)
    assert code == 0, err
    sweep_id = out.strip()

    def trials() -> list[dict]:
        return json.loads(cli(server, "sweep", "trials", sweep_id, "-o", "json")[1])["trials"]

    # A 2 x 2 grid, 2 trials at a time.
    shown = wait_for(lambda: t if len(t := trials()) == 2 else None, 15, "2 trials")
    assert {(t["params"]["opt"], t["state"]) for t in shown} <= {
        ("sgd", "RUNNING"),
        ("adam", "RUNNING"),
    }
    assert [t["index"] for t in shown] == [0, 1]
    code, out, _ = cli(server, "sweep", "list")
    assert code == 0 and sweep_id in out and "cli-sweep" in out and "RUNNING" in out
    code, out, _ = cli(server, "sweep", "get", sweep_id)
    assert "Objective:     maximize accuracy" in out and "Trials:        2 running" in out
    code, out, _ = cli(server, "sweep", "kill", sweep_id, "-m", "enough")
    assert (code, out.strip()) == (0, f"sweep {sweep_id} KILLED")
    data = json.loads(cli(server, "sweep", "get", sweep_id, "-o", "json")[1])
    assert (data["state"], data["reason"], data["trials"]) == ("KILLED", "enough", {"killed": 2})


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (("max_trials: 10", "max_trials: 0"), "error: invalid: max_trials: must be 1 to 10000"),
        (("objective:", "objectiv:"), "error: invalid: objectiv: unknown key"),
        (
            ("{log_uniform: [0.001, 0.1]}", "{log_uniform: [0.001]}"),
            "error: invalid: space.lr.log_uniform: give [low, high]",
        ),
    ],
)
def test_a_bad_sweep_file_is_one_error_line(
    server: Server, change: tuple[str, str], line: str
) -> None:
    code, out, err = cli(server, "sweep", "submit", "-", stdin=SWEEP.replace(*change))
    assert code != 0 and out == ""
    assert err.strip().startswith(line), err


def test_an_unknown_sweep_is_not_found(server: Server) -> None:
    code, _, err = cli(server, "sweep", "get", "nope")
    assert code != 0 and err.startswith("error: not found: sweep nope not found"), err
