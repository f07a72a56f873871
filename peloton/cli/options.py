"""The flags of ``peloton server`` and ``peloton db``, generated from the one declaration of
every option: :class:`peloton.config.ServerConfig` and its fields' :class:`~peloton.config.Flag`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import Field, fields
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

import click

from peloton.cli.common import cli_error
from peloton.config import Flag, ServerConfig, env_var_of, flag_of, load_config_file

F = TypeVar("F", bound=Callable[..., Any])
_DEFAULTS = ServerConfig()
_TYPES = get_type_hints(ServerConfig)


def _load_config(ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    """Eager: the file's values become the defaults that environment and flags override."""
    if value is not None:
        try:
            ctx.default_map = {**(ctx.default_map or {}), **load_config_file(value)}
        except Exception as exc:
            raise cli_error(exc) from None
    return value


config_option = click.option(
    "--config",
    "-c",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PELOTON_CONFIG",
    is_eager=True,
    expose_value=False,
    callback=_load_config,
    help="YAML file of options (keys as the flags, with _); flags and PELOTON_* override it.",
)


def _click_option(f: Field[Any]) -> Callable[[F], F]:
    """The flag and PELOTON_* variable of one ServerConfig field, from its Flag metadata."""
    flag: Flag = f.metadata["flag"]
    kind = _TYPES[f.name]
    param_type: Any = None  # None: click infers it from the default
    if flag.choices:
        param_type = click.Choice(list(flag.choices))
    elif kind is Path:
        param_type = click.Path(file_okay=False, path_type=Path)
    elif kind is int and (flag.min is not None or flag.max is not None):
        param_type = click.IntRange(
            None if flag.min is None else int(flag.min), None if flag.max is None else int(flag.max)
        )
    elif kind is float and (flag.min is not None or flag.max is not None):
        param_type = click.FloatRange(flag.min, flag.max)
    return click.option(
        flag_of(f.name),
        type=param_type,
        default=getattr(_DEFAULTS, f.name),
        envvar=env_var_of(f.name),
        show_default=flag.show_default,
        help=flag.help or None,
    )


def config_options(*names: str) -> Callable[[F], F]:
    """The flags of these ServerConfig fields (all of them if none is named), in field order."""
    chosen = [f for f in fields(ServerConfig) if not names or f.name in names]

    def decorate(command: F) -> F:
        for f in reversed(chosen):  # click lists the options of the last decorator first
            command = _click_option(f)(command)
        return command

    return decorate


database_options = config_options("db_url", "data_dir")
