"""Static bearer tokens: a YAML file of the SHA-256 of each token with its user and groups,
re-read while the daemon runs.

The file holds no token itself, only ``sha256`` (hex) of each, so that a leaked copy of it
(backups, config management) lets nobody in; tokens must be long and random (``openssl rand
-hex 32``), which is what makes an unsalted hash enough::

    tokens:
      - user: alice
        groups: [research, vision]
        sha256: 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8

A watcher thread polls the file's identity (inode, size, modification time) every
``interval`` seconds and loads it again when it changed; a file that cannot be read or parsed
then is logged and the tokens it had keep working.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from peloton.core.access import Caller
from peloton.errors import InvalidArgument

log = logging.getLogger(__name__)

# How often the watcher looks at the file.
RELOAD_INTERVAL_SECONDS = 1.0
_SHA256 = re.compile(r"[0-9a-f]{64}")


def token_digest(token: str) -> str:
    """The hex SHA-256 of a token, as the tokens file holds it."""
    return hashlib.sha256(token.encode()).hexdigest()


def _groups(where: str, value: Any) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(g, str) and g for g in value):
        raise InvalidArgument(f"{where}.groups", "must be a list of group names")
    return frozenset(value)


def parse_tokens(text: str, source: str) -> dict[str, Caller]:
    """The callers of a tokens file's text by token digest; errors name the entry and field
    (``auth_tokens_file.tokens[2].sha256``)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        raise InvalidArgument("auth_tokens_file", f"{source} is not valid YAML") from None
    if not isinstance(data, dict) or set(data) != {"tokens"}:
        raise InvalidArgument(
            "auth_tokens_file", f"{source} must be a mapping with one key, tokens"
        )
    entries = data["tokens"] or []
    if not isinstance(entries, list):
        raise InvalidArgument("auth_tokens_file.tokens", "must be a list of entries")
    callers: dict[str, Caller] = {}
    for i, entry in enumerate(entries):
        where = f"auth_tokens_file.tokens[{i}]"
        if not isinstance(entry, dict):
            raise InvalidArgument(where, "must be a mapping of user, groups, sha256")
        unknown = set(entry) - {"user", "groups", "sha256"}
        if unknown:
            raise InvalidArgument(f"{where}.{sorted(unknown)[0]}", "unknown key")
        user = entry.get("user")
        if not isinstance(user, str) or not user:
            raise InvalidArgument(f"{where}.user", "must be a non-empty user name")
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest.lower()):
            raise InvalidArgument(
                f"{where}.sha256", "must be the token's SHA-256 as 64 hex digits (sha256sum)"
            )
        digest = digest.lower()
        if digest in callers:
            raise InvalidArgument(f"{where}.sha256", "the same token is listed twice")
        callers[digest] = Caller(user, _groups(where, entry.get("groups")), "token")
    return callers


def _identity(path: Path) -> tuple[int, int, int, int]:
    """What changes when the file is edited or replaced."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class TokenFile:
    """The tokens of a file, kept current by a watcher thread (:meth:`start`, :meth:`stop`).

    The constructor loads the file: a daemon does not start with a tokens file it cannot read.
    :meth:`lookup` is safe from any thread and never blocks (it reads one dict reference)."""

    def __init__(self, path: str, interval: float = RELOAD_INTERVAL_SECONDS) -> None:
        self.path = Path(path)
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._seen: tuple[int, int, int, int] | None = _identity(self.path)
        except OSError as exc:
            raise InvalidArgument(
                "auth_tokens_file", f"cannot read {path}: {exc.strerror}"
            ) from None
        self._callers: Mapping[str, Caller] = self._read()

    def _read(self) -> dict[str, Caller]:
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise InvalidArgument(
                "auth_tokens_file", f"cannot read {self.path}: {reason}"
            ) from None
        return parse_tokens(text, str(self.path))

    def __len__(self) -> int:
        return len(self._callers)

    def lookup(self, token: str) -> Caller | None:
        """The caller of ``token``, or None for a token the file does not list."""
        return self._callers.get(token_digest(token))

    def reload_if_changed(self) -> None:
        """Load the file again if it changed since it was last looked at; log what happened."""
        try:
            seen: tuple[int, int, int, int] | None = _identity(self.path)
        except OSError as exc:
            if self._seen is not None:  # logged once, until the file is back
                self._seen = None
                self._not_reloaded(f"cannot read {self.path}: {exc.strerror}")
            return
        if seen == self._seen:
            return
        self._seen = seen
        try:
            callers = self._read()
        except InvalidArgument as exc:
            self._not_reloaded(str(exc))
            return
        self._callers = callers
        log.info("tokens file reloaded", extra={"path": str(self.path), "tokens": len(callers)})

    def _not_reloaded(self, error: str) -> None:
        log.error(
            "tokens file not reloaded; the tokens loaded before still work",
            extra={"path": str(self.path), "error": error},
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="tokens-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            self.reload_if_changed()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
