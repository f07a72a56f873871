"""Minicluster container start latency: from LAUNCH to TASK_RUNNING and to the task's first
output, for a task in a Docker image with the layer cache cold and warm, beside a bare process.

Run from the repository root, as root (containers mount an overlay)::

    .venv/bin/python -m bench.bench_containers [--runs N] [--quick]

A one-agent minicluster (real processes) with a local registry of one image: a layer of ``sh``
and ``date`` with their libraries (about 2 MB), and, unless ``--quick``, a second layer holding
this Python's standard library (for 3.11 some 2,500 files, 100 MB: what a real image carries). A
framework in this process (the master's own calls, no HTTP) launches one task at a time as a task
group: ``date +%s%N``, in the image or (bare) on the host. Per run:

* **LAUNCH -> TASK_RUNNING**: from just before the ACCEPT to the RUNNING status's timestamp (the
  agent sends it once the command was executed);
* **LAUNCH -> first output**: to the time the task printed (its ``date``), i.e. including the
  exec of the shell and of ``date``.

Each run does bare, then the image with the layer cache emptied (cold: every layer extracted),
then the image again (warm: nothing extracted); medians of ``--runs`` runs and their ratios to
bare are printed and written to ``.bench/bench_containers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from peloton.images import write_image
from peloton.minicluster import AgentSpec, Minicluster
from peloton.minicluster.hostrootfs import host_rootfs
from peloton.minicluster.model import TERMINAL_STATES
from peloton.minicluster.recordio import Decoder

OUT = Path(".bench")
IMAGE = "bench:1"
RESOURCES = "cpus:4;mem:4096;disk:10000"
EXECUTOR = [
    {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}},
    {"name": "mem", "type": "SCALAR", "scalar": {"value": 32}},
    {"name": "disk", "type": "SCALAR", "scalar": {"value": 10}},
]
KINDS = ("bare", "cold", "warm")
WAIT = 60.0


def build_registry(root: Path, quick: bool) -> tuple[Path, int]:
    """The registry holding IMAGE; (it, the image's size in bytes)."""
    layers = [host_rootfs(root / "layers/base", ("sh", "date"))]
    if not quick:
        stdlib = root / "layers/stdlib"
        shutil.copytree(
            sysconfig.get_paths()["stdlib"],
            stdlib / "usr/lib/python3",
            ignore=shutil.ignore_patterns("__pycache__", "site-packages"),
        )
        layers.append(stdlib)
    registry = root / "registry"
    write_image(registry / f"{IMAGE}.tar", IMAGE, layers, env={"PATH": "/bin"})
    return registry, (registry / f"{IMAGE}.tar").stat().st_size


class Framework:
    """A v1 framework inside this process: the master's calls, its event stream decoded."""

    def __init__(self, mc: Minicluster) -> None:
        self.mc = mc
        info = {
            "user": "root",
            "name": "bench-containers",
            "capabilities": [{"type": "PARTITION_AWARE"}],
        }
        self.subscriber, framework = mc.master.subscribe({"subscribe": {"framework_info": info}})
        self.id = framework.id
        self._decoder = Decoder()
        self._offers: list[dict[str, Any]] = []
        self._seq = 0

    def _event(self) -> dict[str, Any]:
        record = self.subscriber.queue.get(timeout=WAIT)
        assert record is not None, "the master closed the stream"
        (event,) = self._decoder.feed(record)
        parsed: dict[str, Any] = json.loads(event)
        return parsed

    def _call(self, kind: str, body: dict[str, Any]) -> None:
        call = {"type": kind, "framework_id": {"value": self.id}, kind.lower(): body}
        self.mc.master.call(call, self.subscriber.stream_id)

    def _offer(self) -> dict[str, Any]:
        while not self._offers:
            event = self._event()
            if event["type"] == "OFFERS":
                self._offers.extend(event["offers"]["offers"])
        return self._offers.pop(0)

    def run(self, image: str | None) -> tuple[float, float]:
        """Launch one ``date +%s%N`` task (in ``image``, or bare); (seconds to TASK_RUNNING,
        seconds to its output), from the launch."""
        offer = self._offer()
        self._seq += 1
        task_id = f"t{self._seq}"
        task: dict[str, Any] = {
            "name": task_id,
            "task_id": {"value": task_id},
            "agent_id": offer["agent_id"],
            "resources": [
                {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.5}},
                {"name": "mem", "type": "SCALAR", "scalar": {"value": 64}},
            ],
            "command": {"shell": True, "value": "date +%s%N"},
        }
        if image is not None:
            docker = {"type": "DOCKER", "docker": {"name": image}}
            task["container"] = {"type": "MESOS", "mesos": {"image": docker}}
        executor = {
            "type": "DEFAULT",
            "executor_id": {"value": f"e{self._seq}"},
            "framework_id": {"value": self.id},
            "resources": EXECUTOR,
        }
        operation = {
            "type": "LAUNCH_GROUP",
            "launch_group": {"executor": executor, "task_group": {"tasks": [task]}},
        }
        launched = time.time()
        self._call(
            "ACCEPT",
            {
                "offer_ids": [offer["id"]],
                "operations": [operation],
                "filters": {"refuse_seconds": 0},
            },
        )
        statuses = self._statuses(task_id)
        states = {s["state"]: s["timestamp"] for s in statuses}
        assert "TASK_FINISHED" in states, f"{task_id} ended: {statuses[-1]}"
        sandbox = self.mc.task(task_id).sandbox
        assert sandbox is not None
        printed = int((sandbox / "stdout").read_text().split()[0]) / 1e9
        return states["TASK_RUNNING"] - launched, printed - launched

    def _statuses(self, task_id: str) -> list[dict[str, Any]]:
        """The task's statuses (acknowledged) until its terminal one; offers are kept."""
        statuses: list[dict[str, Any]] = []
        while not statuses or statuses[-1]["state"] not in TERMINAL_STATES:
            event = self._event()
            if event["type"] == "OFFERS":
                self._offers.extend(event["offers"]["offers"])
            elif event["type"] == "UPDATE":
                status = event["update"]["status"]
                if status["task_id"]["value"] == task_id:
                    statuses.append(status)
                    ack = {k: status[k] for k in ("agent_id", "task_id", "uuid")}
                    self._call("ACKNOWLEDGE", ack)
        return statuses


def run(runs: int, quick: bool, workdir: Path) -> dict[str, Any]:
    registry, size = build_registry(workdir / "image", quick)
    samples: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    with Minicluster(
        [AgentSpec("bench-0", RESOURCES, "")],
        work_dir=workdir / "mc",
        allocation_interval=0.05,
        docker_registry=registry,
    ) as mc:
        framework = Framework(mc)
        layers = workdir / "mc/store/docker/layers"
        for _ in range(runs):
            samples["bare"].append(framework.run(None))
            shutil.rmtree(layers, ignore_errors=True)
            samples["cold"].append(framework.run(IMAGE))
            samples["warm"].append(framework.run(IMAGE))
    results: dict[str, Any] = {"runs": runs, "image_bytes": size, "samples": samples}
    for kind in KINDS:
        results[f"{kind}_running_s"] = statistics.median(s[0] for s in samples[kind])
        results[f"{kind}_output_s"] = statistics.median(s[1] for s in samples[kind])
    return results


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="runs of each kind (median)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 3 runs, the small layer only"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = 3
    if os.geteuid() != 0:
        print("bench_containers: skipped, containers need root (overlay mounts)")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-containers-") as tmp:
        results = run(args.runs, args.quick, Path(tmp))
    results["machine"] = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"{platform.python_version()}, Linux {platform.release()}"
    )
    results["commit"] = _commit()
    results["date"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_containers.json").write_text(json.dumps(results, indent=2))
    _report(results)
    return 0


def _report(results: dict[str, Any]) -> None:
    mb = results["image_bytes"] / 1e6
    print(
        f"container start latency, median of {results['runs']} runs "
        f"({results['machine']}; commit {results['commit']}; {results['date']})"
    )
    print(f"  {'':34} {'LAUNCH -> RUNNING':>18} {'LAUNCH -> output':>18}")
    labels = {
        "bare": "bare process (no image)",
        "cold": f"image {mb:.0f} MB, layer cache cold",
        "warm": f"image {mb:.0f} MB, layer cache warm",
    }
    for kind in KINDS:
        running, output = results[f"{kind}_running_s"], results[f"{kind}_output_s"]
        print(f"  {labels[kind]:34} {running * 1e3:15.1f} ms {output * 1e3:15.1f} ms")
    for kind in ("warm", "cold"):
        ratio_running = results[f"{kind}_running_s"] / results["bare_running_s"]
        ratio_output = results[f"{kind}_output_s"] / results["bare_output_s"]
        print(f"  {kind} / bare {'':24} {ratio_running:16.1f}x {ratio_output:16.1f}x")


if __name__ == "__main__":
    raise SystemExit(main())
