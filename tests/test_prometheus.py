"""A real Prometheus server (Debian package prometheus) scrapes a daemon and answers queries.

`make test` installs prometheus (scripts/install-prometheus.sh); without it these tests fail.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from daemon import address, free_port, in_process_server, migrated_sqlite_url, wait_for
from support import make_spec
from test_deploy import DASHBOARD, PROMETHEUS, dashboard_queries

from peloton.client import PelotonClient
from peloton.server import Server

# Values the dashboard's Grafana variables stand for when its queries are sent here.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$instance": ".*",
    "$pool": ".*",
    "$kind": "gpu",
}


class PrometheusServer:
    """``prometheus`` on a free loopback port with its database in ``workdir``."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: run scripts/install-prometheus.sh (make test does)"
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log_path = workdir / "prometheus.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def wait_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/-/ready", timeout=2
                ) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_for(ready, timeout, "prometheus to be ready", interval=0.1)

    def query(self, promql: str) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/query", query=promql)
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    data = tmp_path / "peloton"
    data.mkdir()
    with in_process_server(migrated_sqlite_url(data), data) as s:
        yield s


@pytest.fixture
def prometheus(tmp_path: Path, server: Server) -> Iterator[PrometheusServer]:
    """Prometheus scraping ``server`` every second, with deploy/prometheus's job and rules."""
    shipped = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    job = shipped["scrape_configs"][0]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{server.metrics_port}"]}]
    job["scrape_interval"] = "1s"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(PROMETHEUS / "rules.yml")],
        "scrape_configs": [job],
    }
    p = PrometheusServer(tmp_path / "prometheus", config)
    try:
        p.wait_ready()
        yield p
    finally:
        p.close()


def test_prometheus_scrapes_the_daemon_and_answers_a_query(
    prometheus: PrometheusServer, server: Server
) -> None:
    # No Mesos here, so the job stays PENDING: Prometheus must come to see exactly one.
    with PelotonClient(address(server.grpc_port), timeout=10) as client:
        client.create_job(make_spec(2, pool="/vision"))

    def pending() -> list[dict[str, Any]] | None:
        result = prometheus.query('peloton_jobs{state="PENDING"}')
        return result if result and float(result[0]["value"][1]) == 1 else None

    (sample,) = wait_for(pending, 30, "Prometheus to see one PENDING job", interval=0.2)
    assert sample["metric"]["job"] == "peloton"  # the job name of deploy/prometheus's config
    assert sample["metric"]["instance"] == f"127.0.0.1:{server.metrics_port}"
    up = prometheus.query('up{job="peloton"}')
    assert [float(r["value"][1]) for r in up] == [1.0]


def test_prometheus_loaded_the_alert_rules_and_runs_the_dashboard_queries(
    prometheus: PrometheusServer,
) -> None:
    groups = prometheus.get("/api/v1/rules")["data"]["groups"]
    shipped = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())["groups"]
    assert [r["name"] for g in groups for r in g["rules"]] == [
        r["alert"] for g in shipped for r in g["rules"]
    ]

    def evaluated() -> bool:
        rules = [r for g in prometheus.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        failed = {r["name"]: r.get("lastError") for r in rules if r["health"] == "err"}
        assert not failed, failed
        return all(r["health"] == "ok" for r in rules)

    wait_for(evaluated, 30, "every rule evaluated", interval=0.2)
    for expr in dashboard_queries(json.loads(DASHBOARD.read_text())):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        # A template variable's label_values(SELECTOR, LABEL) is Grafana's; its selector is PromQL.
        expr = re.sub(r"^label_values\((.*), \w+\)$", r"\1", expr)
        prometheus.query(expr)
