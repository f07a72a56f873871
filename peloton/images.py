"""Docker image archives in ``docker save`` format: written from directory trees, read back.

An archive holds one image, in both layouts ``docker save`` has used, so that every reader finds
what it expects:

* the legacy layout, the only one Mesos 1.11's local puller (``--docker_registry=DIR``) reads:
  ``repositories`` (``{repository: {tag: top layer id}}``) and, per layer, ``ID/layer.tar``,
  ``ID/VERSION`` and ``ID/json`` (its ``parent``, and the image config in the top layer's);
* the manifest layout: ``manifest.json`` (``[{"Config", "RepoTags", "Layers"}]``) and the image
  config ``DIGEST.json`` (``config``: Entrypoint, Cmd, Env, WorkingDir; ``rootfs.diff_ids``).

A layer is a directory tree packed as one uncompressed tar. Packing is deterministic (entries
sorted, mtimes, owners and permissions' owners fixed), so the same trees give the same digests
and the same archive. Whiteouts are files like any other: ``.wh.NAME`` in a layer deletes NAME of
the layers below, ``.wh..wh..opq`` in a directory hides what the layers below have in it.

A reference is ``REPOSITORY[:TAG]``; the repository may hold ``/`` and a ``host:port/`` registry
prefix; the tag defaults to ``latest``. Digest references (``@sha256:...``) are not supported.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import tarfile
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

DEFAULT_TAG = "latest"
# What fixed mtimes and the config's "created" read as: nothing in an image depends on the clock.
_CREATED = "1970-01-01T00:00:00Z"
_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}


class ImageError(ValueError):
    """An archive or reference that cannot be read as a Docker image."""


@dataclass(frozen=True)
class ImageConfig:
    """What an image says about running it (empty: not set)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""


@dataclass(frozen=True)
class Layer:
    """One layer of an archive."""

    id: str  # its directory in the archive (the legacy layer id)
    digest: str  # "sha256:HEX" of the uncompressed layer tar (its diff id)
    member: str  # the layer tar's path in the archive


@dataclass(frozen=True)
class Image:
    """An image archive as read by :func:`read_image`; ``layers`` bottom to top."""

    path: Path
    reference: str
    layers: tuple[Layer, ...]
    config: ImageConfig


def parse_reference(reference: str) -> tuple[str, str]:
    """(repository, tag) of ``REPOSITORY[:TAG]``; ImageError for an empty or digest reference."""
    if "@" in reference:
        raise ImageError(f"image '{reference}': digest references are not supported")
    repository, tag = reference, DEFAULT_TAG
    head, sep, tail = reference.rpartition(":")
    if sep and "/" not in tail:  # a colon before the last '/' is a registry's port
        repository, tag = head, tail
    if not repository or not tag:
        raise ImageError(f"image '{reference}': expected REPOSITORY[:TAG]")
    return repository, tag


# ---------------------------------------------------------------------------- writing


def write_image(
    out: Path,
    reference: str,
    layers: Sequence[Path],
    *,
    entrypoint: Sequence[str] | None = None,
    cmd: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    workdir: str = "",
) -> None:
    """Write the image ``reference`` to the archive ``out``: each of ``layers`` (directories,
    bottom first) packed as one layer, with this config. ``out`` appears whole or not at all."""
    repository, tag = parse_reference(reference)
    if not layers:
        raise ImageError(f"image '{reference}': an image needs at least one layer")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".image-") as scratch:
        packed = [
            _pack_layer(Path(root), Path(scratch) / f"{i}.tar") for i, root in enumerate(layers)
        ]
        config = _config_json(entrypoint, cmd, env, workdir, [digest for _, digest in packed])
        ids = _layer_ids([digest for _, digest in packed], config)
        partial = Path(scratch) / "image.tar"
        with tarfile.open(partial, "w", format=tarfile.GNU_FORMAT) as archive:
            for i, ((tar, _), layer_id) in enumerate(zip(packed, ids, strict=True)):
                meta = _layer_json(
                    layer_id, ids[i - 1] if i else None, config, top=i == len(ids) - 1
                )
                _add_bytes(archive, f"{layer_id}/VERSION", b"1.0")
                _add_bytes(archive, f"{layer_id}/json", meta)
                archive.add(tar, f"{layer_id}/layer.tar", filter=_normalized)
            config_name = f"{hashlib.sha256(config).hexdigest()}.json"
            manifest = [
                {
                    "Config": config_name,
                    "RepoTags": [f"{repository}:{tag}"],
                    "Layers": [f"{layer_id}/layer.tar" for layer_id in ids],
                }
            ]
            _add_bytes(archive, config_name, config)
            _add_bytes(archive, "manifest.json", _dumps(manifest))
            _add_bytes(archive, "repositories", _dumps({repository: {tag: ids[-1]}}))
        os.replace(partial, out)


def _pack_layer(root: Path, tar_path: Path) -> tuple[Path, str]:
    """Pack the tree ``root`` into ``tar_path``; (that path, its "sha256:HEX" digest)."""
    if not root.is_dir():
        raise ImageError(f"layer '{root}' is not a directory")
    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        for path in _walk(root):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            if info is None:
                continue  # a socket: nothing a layer can hold
            info = _normalized(info)
            if info.isreg():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)
    with tar_path.open("rb") as packed:
        digest = hashlib.file_digest(packed, "sha256").hexdigest()
    return tar_path, f"sha256:{digest}"


def _walk(root: Path) -> Iterator[Path]:
    """Every path under ``root``, a directory before what it holds, names sorted."""
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        yield Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(Path(entry.path))


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """``info`` with what would make two packings of one tree differ (times, owners) fixed."""
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = _normalized(tarfile.TarInfo(name))
    info.size = len(data)
    info.mode = 0o644
    archive.addfile(info, io.BytesIO(data))


def _config_json(
    entrypoint: Sequence[str] | None,
    cmd: Sequence[str] | None,
    env: Mapping[str, str] | None,
    workdir: str,
    diff_ids: list[str],
) -> bytes:
    config: dict[str, Any] = {
        "Env": [f"{k}={v}" for k, v in (env or {}).items()],
        "Entrypoint": list(entrypoint) if entrypoint is not None else None,
        "Cmd": list(cmd) if cmd is not None else None,
        "WorkingDir": workdir,
    }
    return _dumps(
        {
            "architecture": _ARCHITECTURES.get(platform.machine(), platform.machine()),
            "os": "linux",
            "created": _CREATED,
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created": _CREATED, "created_by": "peloton.images"} for _ in diff_ids],
        }
    )


def _layer_ids(diff_ids: list[str], config: bytes) -> list[str]:
    """Legacy layer ids: each names its layer and everything below; the top one the config too
    (as Docker's v1 ids do, so two images that differ only in config have different tops)."""
    ids: list[str] = []
    for i, diff_id in enumerate(diff_ids):
        seed = f"{ids[-1] if ids else ''} {diff_id}".encode()
        if i == len(diff_ids) - 1:
            seed += b" " + config
        ids.append(hashlib.sha256(seed).hexdigest())
    return ids


def _layer_json(layer_id: str, parent: str | None, config: bytes, *, top: bool) -> bytes:
    meta: dict[str, Any] = {"id": layer_id, "created": _CREATED, "container_config": {}}
    if parent is not None:
        meta["parent"] = parent
    if top:
        image = json.loads(config)
        meta.update(config=image["config"], architecture=image["architecture"], os=image["os"])
    return _dumps(meta)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------- reading


def read_image(path: Path, reference: str | None = None) -> Image:
    """The image ``reference`` (or the archive's only image) of the ``docker save`` archive
    ``path``, from ``manifest.json`` if present, else from the legacy ``repositories``.
    ImageError if it is not there or the archive is malformed; OSError if it cannot be read."""
    try:
        with tarfile.open(path) as archive:
            members = {m.name.removeprefix("./"): m for m in archive.getmembers()}
            if "manifest.json" in members:
                return _from_manifest(path, archive, members, reference)
            if "repositories" in members:
                return _from_repositories(path, archive, members, reference)
    except (tarfile.TarError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ImageError(f"'{path}' is not a readable image archive: {exc}") from None
    raise ImageError(f"'{path}' has neither 'manifest.json' nor 'repositories'")


def _from_manifest(
    path: Path,
    archive: tarfile.TarFile,
    members: dict[str, tarfile.TarInfo],
    reference: str | None,
) -> Image:
    entries = json.loads(_read(archive, members["manifest.json"]))
    entry = _pick(
        path,
        [(tag, e) for e in entries for tag in e.get("RepoTags") or [""]],
        reference,
    )
    config = json.loads(_read(archive, members[entry["Config"]]))
    diff_ids = config.get("rootfs", {}).get("diff_ids") or []
    names = [name.removeprefix("./") for name in entry["Layers"]]
    if len(diff_ids) != len(names):
        raise ImageError(f"'{path}': {len(names)} layers but {len(diff_ids)} diff ids")
    layers = tuple(
        Layer(id=name.removesuffix("/layer.tar"), digest=digest, member=name)
        for name, digest in zip(names, diff_ids, strict=True)
    )
    name = reference if reference is not None else str((entry.get("RepoTags") or [""])[0])
    return Image(path, name, layers, _image_config(config.get("config")))


def _from_repositories(
    path: Path,
    archive: tarfile.TarFile,
    members: dict[str, tarfile.TarInfo],
    reference: str | None,
) -> Image:
    repositories = json.loads(_read(archive, members["repositories"]))
    tops = [
        (f"{repo}:{tag}", top) for repo, tags in repositories.items() for tag, top in tags.items()
    ]
    top = _pick(path, tops, reference)
    chain: list[str] = []
    layer_id: str | None = top
    top_meta: dict[str, Any] = {}
    while layer_id:
        if layer_id in chain:
            raise ImageError(f"'{path}': layer '{layer_id}' is its own ancestor")
        meta = json.loads(_read(archive, members[f"{layer_id}/json"]))
        top_meta = top_meta or meta
        chain.append(layer_id)
        layer_id = meta.get("parent") or None
    layers = tuple(
        Layer(id=i, digest=_digest(archive, members[f"{i}/layer.tar"]), member=f"{i}/layer.tar")
        for i in reversed(chain)
    )
    name = reference if reference is not None else tops[0][0]
    return Image(path, name, layers, _image_config(top_meta.get("config")))


def _pick(path: Path, candidates: list[tuple[str, Any]], reference: str | None) -> Any:
    """The candidate tagged ``reference`` (normalized: ``repo`` is ``repo:latest``), or the
    only one when no reference is given."""
    if reference is None:
        if len(candidates) != 1:
            raise ImageError(f"'{path}' holds {len(candidates)} images: name one")
        return candidates[0][1]
    want = ":".join(parse_reference(reference))
    for tag, value in candidates:
        if tag and ":".join(parse_reference(tag)) == want:
            return value
    raise ImageError(f"'{path}' has no image '{reference}'")


def _image_config(config: Any) -> ImageConfig:
    config = config if isinstance(config, dict) else {}
    env: dict[str, str] = {}
    for item in config.get("Env") or []:
        name, sep, value = str(item).partition("=")
        if sep:  # as Mesos, a variable without '=' is skipped
            env[name] = value
    return ImageConfig(
        entrypoint=tuple(str(a) for a in config.get("Entrypoint") or ()),
        cmd=tuple(str(a) for a in config.get("Cmd") or ()),
        env=env,
        workdir=str(config.get("WorkingDir") or ""),
    )


def _read(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    data = archive.extractfile(member)
    if data is None:
        raise ImageError(f"'{member.name}' is not a file")
    with data:
        return data.read()


def _digest(archive: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    data = archive.extractfile(member)
    if data is None:
        raise ImageError(f"'{member.name}' is not a file")
    digest = hashlib.sha256()
    with data:
        for chunk in iter(lambda: data.read(1 << 20), b""):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


@contextlib.contextmanager
def open_layer(image: Image, layer: Layer) -> Iterator[tarfile.TarFile]:
    """The layer's tar (compressed or not), read from the image's archive."""
    with tarfile.open(image.path) as archive:
        data: IO[bytes] | None = archive.extractfile(layer.member)
        if data is None:
            raise ImageError(f"'{image.path}': '{layer.member}' is not a file")
        with data, tarfile.open(fileobj=data, mode="r:*") as tar:
            yield tar
