"""``peloton minicluster up``: a local Mesos-compatible cluster in the foreground."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

import click

from peloton.cli.common import EXIT_USAGE, CliError
from peloton.logs import setup_logging
from peloton.minicluster import AgentSpec, Minicluster
from peloton.minicluster.http import read_credentials
from peloton.minicluster.spec import DEFAULT_ATTRIBUTES, DEFAULT_RESOURCES


@click.group()
def minicluster() -> None:
    """A local cluster that speaks the Mesos v1 scheduler API (for development and tests)."""


@minicluster.command()
@click.option("--port", default=5050, show_default=True, help="Master port (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option("--agents", "count", default=2, show_default=True, help="Number of agents.")
@click.option(
    "--resources",
    default=DEFAULT_RESOURCES,
    show_default=True,
    help="Each agent's resources (Mesos --resources syntax; NAME(ROLE):VALUE is statically "
    "reserved for ROLE, e.g. 'gpus(gpu):2;cpus(gpu):4;cpus:4;mem:8192').",
)
@click.option(
    "--attributes", default=DEFAULT_ATTRIBUTES, show_default=True, help="Each agent's attributes."
)
@click.option(
    "--agents-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML list of agents {hostname, resources, attributes}; replaces --agents. Agents may "
    "share a hostname (each has its own agent id).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where sandboxes go (default: a temporary directory, removed on exit).",
)
@click.option(
    "--docker-registry",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Directory of 'docker save' archives (NAME.tar, e.g. trainer:1.0.tar), as a Mesos "
    "agent's --docker_registry: tasks whose ContainerInfo names an image run in it (needs root).",
)
@click.option(
    "--credentials",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Mesos --credentials file: JSON {"credentials": [{"principal": P, "secret": S}]}; '
    "used with --authenticate-http-frameworks.",
)
@click.option(
    "--authenticate-http-frameworks",
    is_flag=True,
    help="As Mesos's --authenticate_http_frameworks with --http_framework_authenticators=basic: "
    "every scheduler request must authenticate with HTTP Basic as a principal of --credentials "
    "(else 401), and a framework's principal must be that one.",
)
@click.option("--simulated", is_flag=True, help="No processes: tasks run on a clock.")
@click.option("--heartbeat-interval", default=15.0, show_default=True, help="Seconds.")
@click.option("--log-level", default="info", show_default=True)
def up(
    port: int,
    host: str,
    count: int,
    resources: str,
    attributes: str,
    agents_file: Path | None,
    work_dir: Path | None,
    docker_registry: Path | None,
    credentials: Path | None,
    authenticate_http_frameworks: bool,
    simulated: bool,
    heartbeat_interval: float,
    log_level: str,
) -> None:
    """Run a master with agents until SIGTERM or Ctrl-C, then kill every task and clean up.

    As Mesos 1.11 agents with --switch_user (their default): a framework whose user
    (FrameworkInfo.user) is empty or unknown here has every task dropped (TASK_DROPPED,
    REASON_EXECUTOR_TERMINATED); run as root, tasks run as that user, in sandboxes it owns;
    otherwise only as the user running this. Frameworks are offered the unreserved resources
    and those reserved for their role, and must launch with resources named as offered.

    With --docker-registry, a task whose ContainerInfo (type MESOS) names a Docker image runs in
    a container of it, as on Mesos agents with --image_providers=docker and the overlay
    backend: the image's files under an overlay, the sandbox at /mnt/mesos/sandbox, volumes,
    and the executor's /dev/shm (linux_info.ipc_mode, shm_size). An image with no archive there
    fails its task: "Failed to find archive for image 'NAME' at 'DIR/NAME.tar'".

    \b
    Examples:
      peloton minicluster up --port 5050 --agents 4
      peloton minicluster up --agents-file agents.yaml --work-dir /tmp/mc
      peloton minicluster up --simulated --agents 10000
      peloton minicluster up --authenticate-http-frameworks --credentials creds.json
      sudo peloton minicluster up --docker-registry ./images   # ./images/trainer:1.0.tar
      peloton server --mesos-master 127.0.0.1:5050
    """
    try:
        agents = (
            AgentSpec.load_file(agents_file)
            if agents_file is not None
            else AgentSpec.uniform(count, resources, attributes)
        )
    except ValueError as exc:
        raise CliError(f"invalid: {exc}", EXIT_USAGE) from None
    if authenticate_http_frameworks and credentials is None:
        raise CliError("invalid: --authenticate-http-frameworks needs --credentials", EXIT_USAGE)
    setup_logging(log_level, "text")  # before the credentials: a too open file is warned of
    try:
        secrets = read_credentials(credentials) if credentials is not None else None
    except ValueError as exc:
        raise CliError(f"invalid: {exc}", EXIT_USAGE) from None
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
    cluster = Minicluster(
        agents,
        port=port,
        host=host,
        work_dir=work_dir,
        simulated=simulated,
        heartbeat_interval=heartbeat_interval,
        docker_registry=docker_registry.resolve() if docker_registry is not None else None,
        credentials=secrets if authenticate_http_frameworks else None,
    )
    try:
        cluster.start()
    except OSError as exc:
        raise CliError(f"cannot serve the master on {host}:{port}: {exc.strerror}") from None
    _serve(cluster, len(agents), authenticate_http_frameworks)


def _serve(cluster: Minicluster, agents: int, authenticated: bool) -> None:
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        mode = "simulated" if cluster.simulated else f"work dir {cluster.work_dir}"
        if authenticated:
            mode += ", frameworks authenticate"
        click.echo(f"minicluster master at {cluster.address} with {agents} agents ({mode})")
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        cluster.stop()
        click.echo("minicluster stopped")
