"""The ``peloton`` command given hostile files and flags: one ``error:`` line and exit 2, fast,
before anything is sent (the server address given is one nobody listens on)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from daemon import PELOTON, error_line, run_peloton

from peloton.core.spec import MAX_COMMAND, MAX_YAML_DEPTH

# Nothing listens here: a command that sent its request would fail with exit 1, not 2.
NOWHERE = "127.0.0.1:1"
JOB = "name: train\ninstances: 2\ntask: {command: 'python train.py', resources: {cpu: 1}}\n"

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9)
)


FILES = [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not UTF-8 text"),
    ("name: café\n".encode("latin-1"), "not UTF-8 text (byte 9 is 0xe9)"),
    (JOB.encode("utf-16"), "not UTF-8 text (byte 0 is 0xff)"),
    (("[" * 10_000 + "]" * 10_000).encode(), f"nests deeper than {MAX_YAML_DEPTH} levels"),
    (ALIAS_BOMB.encode(), "values with aliases expanded"),
    (
        JOB.replace("python train.py", "x" * (10 * 1024 * 1024)).encode(),
        f"task.command: is longer than {MAX_COMMAND}",
    ),
]
NAMES = ["binary", "latin-1", "utf-16", "deep", "alias-bomb", "10-mb-command"]
CASES = [
    pytest.param(command, content, expected, id=f"{command[0]}-{name}")
    for command in [("job", "submit"), ("pool", "create")]
    for name, (content, expected) in zip(NAMES, FILES, strict=True)
    if command[0] == "job" or name != "10-mb-command"  # a pool spec has no command
]


@pytest.mark.parametrize(("command", "content", "expected"), CASES)
def test_a_hostile_spec_file_is_one_error_line_and_exit_2(
    tmp_path: Path, command: tuple[str, str], content: bytes, expected: str
) -> None:
    (tmp_path / "spec.yaml").write_bytes(content)
    result = run_peloton(*command, "spec.yaml", server=NOWHERE, cwd=tmp_path, timeout=30)
    assert result.returncode == 2, result.stderr
    line = error_line(result)
    assert line.startswith("error: "), line
    assert expected in line
    assert "internal error" not in line


def test_a_latin1_spec_on_standard_input_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_bytes("name: café\n".encode("latin-1"))
    with (tmp_path / "spec.yaml").open("rb") as stdin:
        done = subprocess.run(
            [PELOTON, "--server", NOWHERE, "job", "submit", "-"],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 2
    assert error_line(done) == "error: -: not UTF-8 text (byte 9 is 0xe9); save it as UTF-8"


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "-inf"])
def test_a_timeout_that_is_not_a_positive_number_is_a_usage_error(value: str) -> None:
    result = run_peloton("--timeout", value, "job", "list", server=NOWHERE)
    assert result.returncode == 2
    assert error_line(result).startswith(
        "error: invalid value for '--timeout': must be a positive number of seconds"
    )
