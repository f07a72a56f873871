"""The shipped config file documents every option and loads as a ServerConfig."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from peloton.config import CONFIG_KEYS, ServerConfig, load_config_file
from peloton.errors import InvalidArgument

ROOT = Path(__file__).resolve().parents[1]
DEPLOY_CONFIG = ROOT / "deploy" / "peloton.yaml"


def test_deploy_config_has_every_option_and_loads() -> None:
    data = load_config_file(DEPLOY_CONFIG)
    assert set(data) == set(CONFIG_KEYS)
    config = ServerConfig(**data)
    assert config.data_dir == Path("/var/lib/peloton")
    assert config.database_url == "sqlite:////var/lib/peloton/peloton.db"


def test_the_readme_configuration_table_has_a_row_for_every_option() -> None:
    section = (ROOT / "README.md").read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    documented = set(re.findall(r"`([a-z_]+)`", "".join(first_cells)))
    assert documented == set(CONFIG_KEYS)


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("grpc_port: 1\ngrcp_host: x\n")
    with pytest.raises(InvalidArgument) as info:
        load_config_file(path)
    assert info.value.field == "config.grcp_host"


@pytest.mark.parametrize("text", ["[1, 2]", "a: [", "- x"])
def test_malformed_file_is_invalid(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(InvalidArgument):
        load_config_file(path)


def test_missing_file_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cannot read"):
        load_config_file(tmp_path / "absent.yaml")
