"""Task containers in the job spec: validation naming the field, image references, defaults
(peloton.core.containers), and the ContainerInfo the host manager sends Mesos."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from test_hostmgr_offers import raw_offer

import peloton
from peloton.core import spec as specs
from peloton.core.containers import (
    DEFAULT_RUNTIME_IMAGE,
    MAX_VOLUMES,
    RUNTIME_DIR,
    RUNTIME_DIR_ENV,
    ContainerLaunch,
    ImageReference,
    Mount,
    container_launch,
    default_shm_mb,
    parse_image,
)
from peloton.core.offers import LaunchTask, Lease
from peloton.core.resources import EXECUTOR_RESOURCES, Resources
from peloton.errors import InvalidArgument
from peloton.hostmgr.launch import launch_group
from peloton.hostmgr.offers import parse_offer
from peloton.v1 import job_pb2

CONTAINER_YAML = """\
name: trainer
instances: 2
task:
  command: python train.py
  resources: {cpu: 1, mem_mb: 1024}
  container:
    image: registry.example.com:5000/team/trainer:1.0
    shm_mb: 256
    runtime: peloton
    volumes:
      - {container_path: /data, host_path: /srv/data, mode: ro}
      - {container_path: /scratch, host_path: /tmp/scratch}
      - {container_path: /models, image: "models:v3"}
"""


def spec_with(container: str, command: str = "echo hi", mem_mb: int = 1024) -> job_pb2.JobSpec:
    text = (
        "name: c\ninstances: 1\ntask:\n"
        f"  command: {command!r}\n  resources: {{cpu: 1, mem_mb: {mem_mb}}}\n"
        f"  container: {container}\n"
    )
    return specs.with_defaults(specs.load_job_spec_yaml(text))


def test_a_container_spec_is_valid_and_resolves_its_defaults() -> None:
    spec = specs.with_defaults(specs.load_job_spec_yaml(CONTAINER_YAML))
    specs.validate_job_spec(spec)
    assert container_launch(spec.task) == ContainerLaunch(
        image="registry.example.com:5000/team/trainer:1.0",
        entrypoint="shell",
        args=(),
        mounts=(
            Mount("/data", host_path="/srv/data", read_only=True),
            Mount("/scratch", host_path="/tmp/scratch", read_only=False),
            Mount("/models", image="models:v3", read_only=True),
        ),
        shm_mb=256,
        runtime="peloton",
    )


def test_without_a_container_nothing_changes() -> None:
    spec = specs.with_defaults(
        specs.load_job_spec_yaml(
            "name: t\ninstances: 1\ntask: {command: 'true', resources: {cpu: 1, mem_mb: 64}}\n"
        )
    )
    specs.validate_job_spec(spec)
    assert container_launch(spec.task) is None


def test_shm_defaults_to_half_the_task_memory() -> None:
    spec = spec_with("{image: busybox}", mem_mb=3000)
    launch = container_launch(spec.task)
    assert launch is not None and launch.shm_mb == 1500 == default_shm_mb(3000)
    assert default_shm_mb(1) == 1


BAD = [
    ("{shm_mb: 1}", "task.container.image", "is required"),
    ("{image: 'Team/Trainer'}", "task.container.image", "names are lower case"),
    ("{image: 'a b'}", "task.container.image", "whitespace"),
    ("{image: 'x@sha256:12'}", "task.container.image", "not a Docker image reference"),
    ("{image: busybox, entrypoint: docker}", "task.container.entrypoint", "unknown entrypoint"),
    ("{image: busybox, args: [a]}", "task.container.args", 'not allowed with entrypoint "shell"'),
    ("{image: busybox, runtime: horovod}", "task.container.runtime", "unknown runtime"),
    ("{image: busybox, shm_mb: 2048}", "task.container.shm_mb", "more than the task's memory"),
    (
        "{image: busybox, volumes: [{container_path: data, host_path: /d}]}",
        "task.container.volumes[0].container_path",
        "must be an absolute path",
    ),
    (
        "{image: busybox, volumes: [{container_path: /a/../b, host_path: /d}]}",
        "task.container.volumes[0].container_path",
        "must be a plain path",
    ),
    (
        "{image: busybox, volumes: [{container_path: /, host_path: /d}]}",
        "task.container.volumes[0].container_path",
        "must not be /",
    ),
    (
        "{image: busybox, volumes: [{container_path: /dev/shm, host_path: /d}]}",
        "task.container.volumes[0].container_path",
        "reserved",
    ),
    (
        "{image: busybox, volumes: [{container_path: /mnt, host_path: /d}]}",
        "task.container.volumes[0].container_path",
        "it is or holds /mnt/mesos/sandbox",
    ),
    (
        f"{{image: busybox, volumes: [{{container_path: {RUNTIME_DIR}/lib, host_path: /d}}]}}",
        "task.container.volumes[0].container_path",
        "reserved",
    ),
    (
        "{image: busybox, volumes: [{container_path: /d}]}",
        "task.container.volumes[0]",
        "exactly one source",
    ),
    (
        "{image: busybox, volumes: [{container_path: /d, host_path: /x, image: busybox}]}",
        "task.container.volumes[0]",
        "exactly one source",
    ),
    (
        "{image: busybox, volumes: [{container_path: /d, host_path: x}]}",
        "task.container.volumes[0].host_path",
        "absolute",
    ),
    (
        "{image: busybox, volumes: [{container_path: /d, image: 'B@d'}]}",
        "task.container.volumes[0].image",
        "not a Docker image reference",
    ),
    (
        "{image: busybox, volumes: [{container_path: /d, host_path: /x, mode: rx}]}",
        "task.container.volumes[0].mode",
        "unknown mode",
    ),
    (
        "{image: busybox, volumes: [{container_path: /d, image: busybox, mode: rw}]}",
        "task.container.volumes[0].mode",
        "read-only",
    ),
    (
        "{image: busybox, volumes: [{container_path: /d, host_path: /x},"
        " {container_path: /d, host_path: /y}]}",
        "task.container.volumes[1].container_path",
        "overlaps task.container.volumes[0] (/d)",
    ),
    (
        "{image: busybox, volumes: [{container_path: /d, host_path: /x},"
        " {container_path: /d/e, host_path: /y}]}",
        "task.container.volumes[1].container_path",
        "overlaps",
    ),
]


@pytest.mark.parametrize(("container", "field", "reason"), BAD)
def test_a_bad_container_names_the_field(container: str, field: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        specs.validate_job_spec(spec_with(container, mem_mb=1024))
    assert err.value.field == field
    assert reason in err.value.reason


def test_too_many_volumes() -> None:
    volumes = ", ".join(
        f"{{container_path: /v{i}, host_path: /x{i}}}" for i in range(MAX_VOLUMES + 1)
    )
    with pytest.raises(InvalidArgument) as err:
        specs.validate_job_spec(spec_with(f"{{image: busybox, volumes: [{volumes}]}}"))
    assert err.value.field == "task.container.volumes"


def test_the_command_follows_the_entrypoint() -> None:
    image = spec_with("{image: busybox, entrypoint: image, args: [--epochs, '3']}", command="")
    specs.validate_job_spec(image)  # the image's ENTRYPOINT runs: no command
    with pytest.raises(InvalidArgument) as err:
        specs.validate_job_spec(spec_with("{image: busybox, entrypoint: image}", command="x"))
    assert err.value.field == "task.command"
    with pytest.raises(InvalidArgument) as err:
        specs.validate_job_spec(spec_with("{image: busybox}", command=""))
    assert (err.value.field, err.value.reason) == ("task.command", "must not be empty")
    with pytest.raises(InvalidArgument) as err:
        specs.validate_job_spec(spec_with("{image: busybox, entrypoint: exec}", command="a b"))
    assert err.value.field == "task.command" and "one program path" in err.value.reason
    specs.validate_job_spec(spec_with("{image: busybox, entrypoint: exec, args: [-c]}", "/bin/x"))


# Docker reference pieces, to generate valid references.
_alnum = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=6)
_component = st.builds(
    lambda parts, seps: parts[0] + "".join(s + p for s, p in zip(seps, parts[1:], strict=False)),
    st.lists(_alnum, min_size=1, max_size=3),
    st.lists(st.sampled_from([".", "_", "__", "-", "--"]), min_size=2, max_size=2),
)
_domain = st.one_of(
    st.just(""),
    st.just("localhost"),
    st.builds(lambda a, b: f"{a}.{b}", _alnum, _alnum),
    st.builds(lambda a, p: f"{a}.io:{p}", _alnum, st.integers(1, 65535)),
)
_tag = st.one_of(st.just(""), st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}\Z"))
_digest = st.one_of(st.just(""), st.from_regex(r"\Asha256:[0-9a-f]{64}\Z"))


@given(_domain, st.lists(_component, min_size=1, max_size=3), _tag, _digest)
def test_valid_references_parse_and_print_back(
    domain: str, path: list[str], tag: str, digest: str
) -> None:
    # Without a domain, a first component that looks like one is read as one (Docker's rule).
    assume(domain or len(path) == 1 or not ("." in path[0] or path[0] == "localhost"))
    joined = "/".join(path)
    text = (f"{domain}/" if domain else "") + joined
    text += f":{tag}" if tag else ""
    text += f"@{digest}" if digest else ""
    ref = parse_image(text)
    assert str(ref) == text
    assert ref == ImageReference(domain, joined, tag, digest)


def test_a_first_component_is_a_domain_only_if_it_looks_like_one() -> None:
    assert parse_image("team/trainer:1").domain == ""
    assert parse_image("localhost/trainer").domain == "localhost"
    assert parse_image("reg.io/trainer").domain == "reg.io"
    assert parse_image("reg:5000/trainer").domain == "reg:5000"
    with pytest.raises(ValueError, match="longer than 255"):
        parse_image("a" * 256)


# ---------------------------------------------------------------------------- to Mesos


def _launch(*containers: ContainerLaunch | None) -> dict:  # type: ignore[type-arg]
    lease = Lease("lease-1", "h1", "a1", (parse_offer(raw_offer("o1"), 0),), 60)
    tasks = [
        LaunchTask(
            f"job-{i}-0",
            f"t-{i}",
            "/bin/train" if c is not None and c.entrypoint == "exec" else "train --fast",
            {"PELOTON_RANK": str(i)},
            Resources(cpu=0.5, mem_mb=256),
            container=c,
        )
        for i, c in enumerate(containers)
    ]
    return launch_group(lease, "fw", "job-0-0-executor", EXECUTOR_RESOURCES, tasks, "rt:9")


def test_a_task_without_a_container_launches_as_before() -> None:
    op = _launch(None)
    assert "container" not in op["launch_group"]["executor"]
    (info,) = op["launch_group"]["task_group"]["tasks"]
    assert "container" not in info
    assert info["command"]["value"] == "train --fast" and info["command"]["shell"] is True


def test_container_info_names_image_volumes_and_a_shared_shm() -> None:
    mounts = (
        Mount("/data", host_path="/srv/data", read_only=True),
        Mount("/m", image="m:1", read_only=True),
    )
    c = ContainerLaunch("trainer:1", "shell", (), mounts, shm_mb=300, runtime="peloton")
    op = _launch(c, c)
    executor = op["launch_group"]["executor"]
    # The executor owns one /dev/shm for both tasks of the host.
    assert executor["container"] == {
        "type": "MESOS",
        "linux_info": {"ipc_mode": "PRIVATE", "shm_size": 600},
    }
    info = op["launch_group"]["task_group"]["tasks"][0]
    assert info["container"] == {
        "type": "MESOS",
        "mesos": {"image": {"type": "DOCKER", "docker": {"name": "trainer:1"}}},
        "volumes": [
            {"container_path": "/data", "mode": "RO", "host_path": "/srv/data"},
            {
                "container_path": "/m",
                "mode": "RO",
                "image": {"type": "DOCKER", "docker": {"name": "m:1"}},
            },
            {
                "container_path": RUNTIME_DIR,
                "mode": "RO",
                "image": {"type": "DOCKER", "docker": {"name": "rt:9"}},
            },
        ],
        "linux_info": {"ipc_mode": "SHARE_PARENT"},
    }
    command = info["command"]
    assert command["shell"] is True
    assert command["value"].endswith("\ntrain --fast")
    assert f"{RUNTIME_DIR}/bin" in command["value"]
    variables = {v["name"]: v["value"] for v in command["environment"]["variables"]}
    assert variables[RUNTIME_DIR_ENV] == RUNTIME_DIR and variables["PELOTON_RANK"] == "0"


def test_exec_and_image_entrypoints_run_without_a_shell() -> None:
    exec_ = ContainerLaunch("x:1", "exec", ("-v", "a b"), (), shm_mb=64)
    image = ContainerLaunch("x:1", "image", ("--epochs", "3"), (), shm_mb=64)
    first, second = _launch(exec_, image)["launch_group"]["task_group"]["tasks"]
    assert first["command"]["shell"] is False
    assert first["command"]["value"] == "/bin/train"
    assert first["command"]["arguments"] == ["/bin/train", "-v", "a b"]
    assert second["command"]["shell"] is False
    assert "value" not in second["command"]  # the image's ENTRYPOINT runs
    assert second["command"]["arguments"] == ["--epochs", "3"]
    assert RUNTIME_DIR_ENV not in {v["name"] for v in second["command"]["environment"]["variables"]}


def test_the_default_runtime_image_is_this_release() -> None:
    assert f"peloton-runtime:{peloton.__version__}" == DEFAULT_RUNTIME_IMAGE
    parse_image(DEFAULT_RUNTIME_IMAGE)


def test_the_readme_job_spec_is_valid() -> None:
    """The annotated spec under README's "Job spec (YAML)", container block included."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("### Job spec (YAML)", 1)[1]
    text = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = specs.with_defaults(specs.load_job_spec_yaml(text))
    specs.validate_job_spec(spec)
    launch = container_launch(spec.task)
    assert launch is not None and launch.runtime == "peloton" and launch.mounts
