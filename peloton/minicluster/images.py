"""The agents' Docker image store: a local registry of ``docker save`` archives, and layers
extracted once into a cache that every agent of a minicluster shares.

As a Mesos 1.11 agent with ``--image_providers=docker --docker_registry=DIR`` (the local puller):
the image ``NAME`` is the archive ``DIR/NAME.tar``, named as the reference is written (``trainer``
is ``DIR/trainer.tar`` and means the tag ``latest`` inside it; a repository with ``/`` is a
sub-directory). A missing archive fails the container's launch with the puller's words.

**Backend: overlay.** Mesos has ``copy`` (each container gets a copy of every layer) and
``overlay`` (the layers, shared read-only, under a per-container upper directory). Overlay starts
a container in constant time whatever the image's size, which is what makes a warm start cheap,
and the kernel has it wherever the minicluster runs as root (the only case where it can mount).
As Mesos's store does for that backend, whiteouts are converted when a layer is stored: ``.wh.NAME``
becomes the overlay whiteout NAME (a 0/0 character device) and ``.wh..wh..opq`` the
``trusted.overlay.opaque`` attribute of its directory, so the kernel applies them at lookup.

Layers are keyed by digest (``CACHE/layers/HEX``). Each is extracted to a staging directory and
renamed into place: agents extracting the same layer at once each finish, one rename wins and the
others' copies are dropped; a layer in place is never extracted again.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from peloton.images import Image, ImageError, Layer, open_layer, read_image

_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
OPAQUE_XATTR = "trusted.overlay.opaque"


class ProvisionError(Exception):
    """An image cannot be provisioned; the message is what the task's failure says."""


@dataclass(frozen=True)
class Provisioned:
    """An image ready to mount: its config, and its extracted layers bottom to top."""

    image: Image
    layers: tuple[Path, ...]


class ImageStore:
    """Images of the registry ``registry``, their layers cached under ``cache``. Thread-safe, and
    safe to share between processes: extraction never leaves a partial layer in place."""

    def __init__(self, registry: Path, cache: Path) -> None:
        self.registry = registry
        self.cache = cache
        self.layers = cache / "layers"
        self._staging = cache / "staging"

    def archive(self, name: str) -> Path:
        """The archive of the image ``name``; ProvisionError as Mesos's local puller words it if
        the registry has none."""
        path = self.registry / f"{name}.tar"
        if not path.is_file():
            raise ProvisionError(f"Failed to find archive for image '{name}' at '{path}'")
        return path

    def provision(self, name: str) -> Provisioned:
        """Read the image ``name`` and extract the layers the cache lacks."""
        try:
            image = read_image(self.archive(name), name)
            return Provisioned(image, tuple(self._layer(image, layer) for layer in image.layers))
        except (ImageError, OSError, tarfile.TarError) as exc:
            raise ProvisionError(f"Failed to provision image '{name}': {exc}") from None

    def layer_path(self, layer: Layer) -> Path:
        """Where the layer is (or will be) extracted."""
        return self.layers / layer.digest.partition(":")[2]

    def _layer(self, image: Image, layer: Layer) -> Path:
        target = self.layer_path(layer)
        if target.is_dir():
            return target
        self.layers.mkdir(parents=True, exist_ok=True)
        self._staging.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=self._staging))
        try:
            staging.chmod(0o755)  # mkdtemp's 0700 would hide the root from the task's user
            with open_layer(image, layer) as tar:
                unpack(tar, staging)
            try:
                staging.rename(target)
            except OSError:
                if not target.is_dir():
                    raise  # not because another extraction won
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target


def unpack(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract a layer tar into ``dest`` with its whiteouts turned into overlay whiteouts.

    Member names are confined to ``dest``, and never go through a symlink that an earlier member
    made (an image's ``/lib -> /usr/lib`` must not let a later entry write to the host).
    Owners, modes (setuid, sticky) and device nodes are kept, as ``tar`` run as root keeps them.
    """
    root = os.path.realpath(dest)
    whiteouts: list[str] = []
    opaque: list[str] = []

    def accept(member: tarfile.TarInfo, _dest: str) -> tarfile.TarInfo | None:
        name = _confined(member.name)
        parent, base = posixpath.split(name)
        _check_parent(root, parent, member.name)
        if base == _OPAQUE:
            opaque.append(parent)
            return None
        if base.startswith(_WHITEOUT):
            whiteouts.append(posixpath.join(parent, base[len(_WHITEOUT) :]))
            return None
        if member.islnk():
            return member.replace(name=name, linkname=_confined(member.linkname), deep=False)
        return member.replace(name=name, deep=False)

    tar.extractall(dest, numeric_owner=True, filter=accept)
    for name in whiteouts:
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, stat.S_IFCHR, os.makedev(0, 0))
    for name in opaque:
        directory = dest / name
        directory.mkdir(parents=True, exist_ok=True)
        os.setxattr(directory, OPAQUE_XATTR, b"y")


def _confined(name: str) -> str:
    """A member name relative to the layer root, as ``tar`` extracts it: a leading ``/`` and
    ``..`` that would climb above the root are dropped."""
    return posixpath.normpath("/" + name).lstrip("/") or "."


def _check_parent(root: str, parent: str, name: str) -> None:
    real = os.path.realpath(os.path.join(root, parent))
    if real != root and not real.startswith(root + os.sep):
        raise ProvisionError(f"layer entry '{name}' goes through a link out of the layer")
