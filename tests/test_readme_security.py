"""README's "Transport and identity" runs as written: its shell blocks, read from README.md, typed
in order into one bash (as in tests/test_readme_using.py: a checkout without the virtualenv on
PATH, a fresh HOME) in a scratch directory that holds the certificates and the token it makes.

The README's daemon listens on every address at the default port and its clients dial
``peloton.example.com``: here the daemon's port is one the kernel picked (``PELOTON_GRPC_PORT``)
and the clients dial ``localhost`` at that port, a name the README's server certificate holds.
Between blocks the test waits for what the text says to wait for: the daemon listening.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

from daemon import wait_for
from test_readme_using import ROOT, Shell, shell_env  # noqa: F401  (shell_env: a fixture)

SERVER_NAME = "peloton.example.com"


def section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("\n### Transport and identity\n", 1)[1].split("\n### ", 1)[0]


def blocks() -> list[str]:
    """The text of every ``sh`` block of the section, in order."""
    return re.findall(r"^```sh\n(.*?)^```$", section(), flags=re.S | re.M)


# What each block does, in order.
BLOCKS = ("certificates", "tokens", "daemon", "clients", "mutual daemon", "mutual client")


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_every_block_is_run_here() -> None:
    assert len(blocks()) == len(BLOCKS), blocks()


def test_transport_and_identity_runs_as_written(
    shell_env: tuple[Path, dict[str, str], int],  # noqa: F811
) -> None:
    clone, env, grpc = shell_env
    texts = dict(zip(BLOCKS, blocks(), strict=True))
    # The clients dial the daemon by a name its certificate holds, at the kernel's port.
    for name in ("clients", "mutual client"):
        texts[name] = texts[name].replace(SERVER_NAME, f"localhost:{grpc}")
    assert f"localhost:{grpc}" in texts["clients"]
    shell = Shell(clone, env)

    def state() -> str:
        return f"the daemon's port {grpc} listening: {listening(grpc)}"

    try:
        shell.run(". .venv/bin/activate\n", state)
        shell.run(texts["certificates"], state)
        for name in ("ca.crt", "server.crt", "alice.crt", "alice.key"):
            assert (clone / name).stat().st_size > 0, name
        shell.run(texts["tokens"], state)
        assert "sha256:" in (clone / "tokens.yaml").read_text()
        token = (clone / "token").read_text().strip()
        assert token not in (clone / "tokens.yaml").read_text()

        shell.run(texts["daemon"], state)
        wait_for(lambda: listening(grpc), 60, "the daemon to listen", 0.1, state)
        out = shell.run(texts["clients"], state)
        assert "Grants:   submit=group:vision" in out, out
        assert re.search(r"alice\s+CreatePool\s+/research\s+OK", out), out
        assert "error: unauthenticated: token not recognised" in out, out
        assert "Traceback" not in out, out

        shell.run(texts["mutual daemon"], state)
        wait_for(lambda: listening(grpc), 60, "the mutual-TLS daemon to listen", 0.1, state)
        out = shell.run(texts["mutual client"], state)
        assert "└─ research" in out, out
        assert "error:" not in out, out
    finally:
        shell.close()
