"""The deploy/ files run as written: promtool accepts the Prometheus config, rules and their unit
tests; the daemon, started from deploy/peloton.yaml, serves metrics that pass `promtool check
metrics` and are exactly the README's Metrics table; the dashboard and the rules only use
documented metrics; the systemd unit verifies; the PostgreSQL setup gives a database that
`peloton db upgrade` fills; the Mesos flags parse.

promtool comes from the Debian package prometheus, which `make test` installs
(scripts/install-prometheus.sh): these tests fail, not skip, without it.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PG_ADMIN_URL
from daemon import PELOTON, DaemonProcess, run_peloton, start_minicluster, wait_for
from sqlalchemy.engine import make_url
from support import make_spec

from peloton.client import PelotonClient
from peloton.config import CONFIG_KEYS, ServerConfig, load_config_file
from peloton.minicluster import AgentSpec, Minicluster
from peloton.minicluster.resources import parse_text
from peloton.minicluster.spec import parse_attributes
from peloton.storage import migrate
from peloton.v1 import job_pb2

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
CONFIG = DEPLOY / "peloton.yaml"
UNIT = DEPLOY / "systemd" / "peloton.service"
DASHBOARD = DEPLOY / "grafana" / "peloton.json"
MESOS = DEPLOY / "mesos"

# Series a Prometheus histogram adds to its documented name.
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
METRIC_NAME = re.compile(r"\bpeloton_[a-z0-9_]+")


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: run scripts/install-prometheus.sh (make test does)"
    return subprocess.run(
        [tool, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


def documented_metrics() -> set[str]:
    """Every metric name in the first column of the README's Metrics table."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`(peloton_[a-z0-9_]+)`", line.split("|")[1]))
    assert names, "no metrics found in the README's Metrics table"
    return names


def undocumented(names: set[str]) -> set[str]:
    """Those of ``names`` that are neither documented nor a documented histogram's series."""
    documented = documented_metrics()
    return {
        name
        for name in names
        if name not in documented
        and not any(
            name.endswith(s) and name.removesuffix(s) in documented for s in HISTOGRAM_SUFFIXES
        )
    }


# ---------------------------------------------------------------------------- Prometheus


def test_prometheus_config_and_its_rule_files_are_valid() -> None:
    result = promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


def test_alert_rules_are_valid() -> None:
    result = promtool("check", "rules", str(PROMETHEUS / "rules.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_pass_their_unit_tests() -> None:
    result = promtool("test", "rules", str(PROMETHEUS / "rules_test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_every_alert_has_a_severity_annotations_a_readme_row_and_firing_and_quiet_tests() -> None:
    tests = yaml.safe_load((PROMETHEUS / "rules_test.yml").read_text())["tests"]
    cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    readme = (ROOT / "README.md").read_text().split("\n## Deploy\n", 1)[1].split("\n## ", 1)[0]
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert f"| `{name}` | {rule['labels']['severity']} |" in readme, f"{name}: not in README"
        ours = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in ours), f"{name}: no test where it fires"
        assert any(not case["exp_alerts"] for case in ours), f"{name}: no test where it is quiet"


def test_alert_rules_use_only_documented_metrics() -> None:
    names = {n for rule in alert_rules() for n in METRIC_NAME.findall(rule["expr"])}
    assert names
    assert not undocumented(names)


# ---------------------------------------------------------------------------- the daemon's metrics

AGENT = "cpus:4;mem:8192;disk:10000;gpus:2;ports:[31000-31100]"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Minicluster]:
    mc = start_minicluster(
        AgentSpec.uniform(2, resources=AGENT, attributes="rack:r1;gpu_model:A100"),
        tmp_path / "cluster",
    )
    yield mc
    mc.stop()


@pytest.fixture
def daemon(tmp_path: Path, cluster: Minicluster) -> Iterator[DaemonProcess]:
    """``peloton server --config deploy/peloton.yaml``, on the database that ``peloton db
    upgrade --config deploy/peloton.yaml`` made, as the README's Deploy section says. Flags move
    its state and ports somewhere a test may use and give it the minicluster: everything else is
    the shipped file's."""
    data_dir = tmp_path / "data"
    upgrade = run_peloton("db", "upgrade", "--config", str(CONFIG), "--data-dir", str(data_dir))
    assert upgrade.returncode == 0, upgrade.stderr
    assert f"to {migrate.head_revision()}" in upgrade.stdout
    flags = ["--data-dir", str(data_dir), "--grpc-port", "0", "--metrics-port", "0"]
    flags += ["--mesos-master", cluster.address, "--config", str(CONFIG)]
    with DaemonProcess(tmp_path / "daemon", flags) as proc:
        yield proc.wait_ready()


def test_daemon_metrics_pass_promtool_and_are_the_readme_table(daemon: DaemonProcess) -> None:
    # A gang run to the end first, so the labelled families have samples too.
    with PelotonClient(daemon.address, timeout=10) as client:
        job_id = client.create_job(make_spec(2, command="true")).job_id

        def succeeded() -> bool:
            return client.get_job(job_id).state == job_pb2.JOB_STATE_SUCCEEDED

        wait_for(succeeded, 60, f"job {job_id} to succeed", interval=0.2)
    url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()

    result = promtool("check", "metrics", stdin=text)
    assert result.returncode == 0, result.stdout + result.stderr

    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE))
    # prometheus_client serves a <name>_created gauge (the creation time) beside each counter
    # and histogram: the library's, not one of peloton's metrics.
    created = {f"{n.removesuffix('_total')}_created" for n, k in families.items() if k == "counter"}
    created |= {f"{n}_created" for n, k in families.items() if k == "histogram"}
    served = set(families) - created
    documented = documented_metrics()
    assert served - documented == set(), "served but not in the README's Metrics table"
    assert documented - served == set(), "in the README's Metrics table but not served"


# ---------------------------------------------------------------------------- Grafana


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    panels = list(dashboard["panels"])
    panels += [p for row in dashboard["panels"] for p in row.get("panels", [])]
    queries = [t["expr"] for p in panels for t in p.get("targets", [])]
    queries += [
        v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"
    ]
    return queries


def test_dashboard_is_json_and_uses_only_documented_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names = {n for q in dashboard_queries(dashboard) for n in METRIC_NAME.findall(q)}
    assert not undocumented(names)
    # What operators look at first: GPUs, pools, queues, placement latency, tasks, restarts.
    for shown in (
        "peloton_cluster_resources",
        "peloton_pool_entitlement",
        "peloton_pool_allocation",
        "peloton_pool_queue_gangs",
        "peloton_placement_seconds_bucket",
        "peloton_gang_placement_seconds_bucket",
        "peloton_tasks",
        "peloton_gang_restarts_total",
        "peloton_gpu_fragmentation",
    ):
        assert shown in names, shown


# ---------------------------------------------------------------------------- config and systemd


def test_deploy_config_documents_every_option_with_its_default() -> None:
    data = load_config_file(CONFIG)
    assert set(data) == set(CONFIG_KEYS)
    # The one deliberate difference: state under /var/lib (the unit's StateDirectory), not the
    # service user's home.
    assert ServerConfig(**data) == ServerConfig(data_dir=Path("/var/lib/peloton"))
    lines = CONFIG.read_text().splitlines()
    for i, line in enumerate(lines):
        key = line.split(":", 1)[0]
        if key in CONFIG_KEYS:
            # Each option, or the group of options it starts, has a comment right above it.
            above = lines[i - 1]
            assert above.startswith("#") or above.split(":", 1)[0] in CONFIG_KEYS, key


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def test_systemd_unit_runs_the_server_from_the_config_as_its_own_user() -> None:
    s = unit_settings()
    assert s["ExecStart"] == ["/usr/local/bin/peloton server --config /etc/peloton/peloton.yaml"]
    assert s["User"] == ["peloton"]
    assert s["Restart"] == ["on-failure"]
    assert s["StateDirectory"] == ["peloton"]  # /var/lib/peloton, data_dir in deploy/peloton.yaml
    assert s["NoNewPrivileges"] == ["true"] and s["ProtectSystem"] == ["strict"]
    # SIGTERM's grace for in-flight RPCs must end before systemd's SIGKILL.
    assert float(s["TimeoutStopSec"][0]) > ServerConfig().shutdown_grace_seconds


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    # verify checks that ExecStart's program exists: the shipped unit names where pip installs
    # it on a server, so a copy names this virtualenv's peloton instead; nothing else changes.
    rendered = tmp_path / "peloton.service"
    rendered.write_text(UNIT.read_text().replace("/usr/local/bin/peloton", PELOTON))
    result = subprocess.run(
        [analyze, "verify", str(rendered)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""


def test_systemd_unit_with_its_credentials_verifies(tmp_path: Path) -> None:
    """The unit's commented secrets, switched on as its comment says, still verify."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    text = UNIT.read_text().replace("/usr/local/bin/peloton", PELOTON)
    credentials = [line for line in text.splitlines() if line.startswith("#LoadCredential=")]
    assert [line.split("=", 1)[1].split(":", 1)[0] for line in credentials] == [
        "server.key",
        "mesos-secret",
    ]
    flags = "--tls-key-file %d/server.key --mesos-secret-file %d/mesos-secret"
    assert flags in " ".join(text.replace("#", " ").split())  # as the comment words it
    for line in credentials:
        text = text.replace(line, line[1:])
    text = text.replace(
        "--config /etc/peloton/peloton.yaml", f"--config /etc/peloton/peloton.yaml {flags}"
    )
    rendered = tmp_path / "peloton.service"
    rendered.write_text(text)
    result = subprocess.run(
        [analyze, "verify", str(rendered)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""


# ---------------------------------------------------------------------------- PostgreSQL


def psql(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("psql")
    assert tool, "psql is missing (scripts/ensure-postgres.sh installs PostgreSQL)"
    return subprocess.run(
        [tool, "-X", "-q", "-d", PG_ADMIN_URL, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def pg_names() -> Iterator[str]:
    """A role and database name of its own (the shared server runs other tests), dropped after."""
    name = f"peloton_deploy_{uuid.uuid4().hex[:10]}"
    yield name
    drop_db = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
    dropped = psql("-c", drop_db, "-c", f'DROP ROLE IF EXISTS "{name}"')
    assert dropped.returncode == 0, dropped.stderr


def test_postgres_setup_makes_a_database_that_db_upgrade_fills(pg_names: str) -> None:
    setup = str(DEPLOY / "postgres" / "setup.sql")
    missing = psql("-f", setup)
    assert missing.returncode != 0 and "password" in missing.stderr
    for password in ("first", "second"):  # running it again is fine and changes the password
        args = ("-v", f"role={pg_names}", "-v", f"dbname={pg_names}", "-v", f"password={password}")
        created = psql(*args, "-f", setup)
        assert created.returncode == 0, created.stderr
    admin = make_url(PG_ADMIN_URL)
    url = f"postgresql://{pg_names}:second@{admin.host}:{admin.port or 5432}/{pg_names}"
    upgrade = run_peloton("db", "upgrade", "--db-url", url)
    assert upgrade.returncode == 0, upgrade.stderr
    current = run_peloton("db", "current", "--db-url", url)
    head = migrate.head_revision()
    assert current.stdout.strip() == f"current {head}, newest {head}"


# ---------------------------------------------------------------------------- Mesos


def env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            assert re.fullmatch(r"MESOS_[A-Z_]+", key), key
            (values[key],) = shlex.split(value)
    return values


def test_mesos_flags_are_what_gpu_gangs_need() -> None:
    master = env_file(MESOS / "master.env")
    agent = env_file(MESOS / "agent.env")
    assert agent["MESOS_MASTER"] == master["MESOS_ZK"]
    isolation = agent["MESOS_ISOLATION"].split(",")
    assert len(isolation) == len(set(isolation))
    assert {"filesystem/linux", "cgroups/devices", "gpu/nvidia"} <= set(isolation)
    # Task containers: images, their runtime config, image volumes, a shared /dev/shm.
    assert {"docker/runtime", "volume/image", "namespaces/ipc"} <= set(isolation)
    assert agent["MESOS_CONTAINERIZERS"] == "mesos"
    assert agent["MESOS_IMAGE_PROVIDERS"] == "docker"
    assert agent["MESOS_IMAGE_PROVISIONER_BACKEND"] in ("overlay", "copy")
    assert Path(agent["MESOS_DOCKER_REGISTRY"]).is_absolute()
    # Mesos flag syntax, as the minicluster (which speaks it too) parses it.
    assert {"rack", "gpu_model"} <= set(parse_attributes(agent["MESOS_ATTRIBUTES"]))
    assert parse_text(agent["MESOS_RESOURCES"])
    for flag in ("gpus:", "ports:["):
        assert flag in agent["MESOS_RESOURCES"]
    # The notes' table shows the same values.
    notes = (MESOS / "README.md").read_text()
    for key in (
        "MESOS_ISOLATION",
        "MESOS_ATTRIBUTES",
        "MESOS_RESOURCES",
        "MESOS_DOCKER_REGISTRY",
        "MESOS_IMAGE_PROVIDERS",
        "MESOS_IMAGE_PROVISIONER_BACKEND",
    ):
        assert f"`{agent[key]}`" in notes, key
