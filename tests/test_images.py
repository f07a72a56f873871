"""Docker image archives (peloton.images): what write_image writes, read_image reads back, in
both the manifest and the legacy (Mesos local puller) layouts; packing is deterministic."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peloton.images import (
    DEFAULT_TAG,
    ImageConfig,
    ImageError,
    open_layer,
    parse_reference,
    read_image,
    write_image,
)


def _tree(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    tool = root / "bin/tool"
    tool.write_text("#!/bin/sh\necho tool\n")
    tool.chmod(0o755)
    (root / "bin/alias").symlink_to("tool")
    os.link(tool, root / "bin/hardlink")
    (root / "etc").mkdir()
    (root / "etc/.wh.gone").touch()  # a whiteout is packed as the file it is
    return root


def _top(root: Path) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc/motd").write_text("hello\n")
    return root


def _write(tmp_path: Path, name: str = "trainer:1.0") -> Path:
    out = tmp_path / "registry" / f"{name}.tar"
    write_image(
        out,
        name,
        [_tree(tmp_path / "l1"), _top(tmp_path / "l2")],
        entrypoint=["/bin/tool"],
        cmd=["--help"],
        env={"PATH": "/bin", "MODE": "a=b"},
        workdir="/work",
    )
    return out


def test_an_archive_reads_back_as_written(tmp_path: Path) -> None:
    image = read_image(_write(tmp_path))
    assert image.reference == "trainer:1.0"
    assert image.config == ImageConfig(
        entrypoint=("/bin/tool",),
        cmd=("--help",),
        env={"PATH": "/bin", "MODE": "a=b"},
        workdir="/work",
    )
    assert len(image.layers) == 2
    contents = []
    with tarfile.open(image.path) as archive:
        for layer in image.layers:
            data = archive.extractfile(layer.member)
            assert data is not None
            digest = hashlib.sha256(data.read()).hexdigest()
            assert layer.digest == f"sha256:{digest}"
            with open_layer(image, layer) as tar:
                contents.append({m.name: m for m in tar.getmembers()})
    bottom, top = contents
    assert sorted(bottom) == ["bin", "bin/alias", "bin/hardlink", "bin/tool", "etc", "etc/.wh.gone"]
    # Names sorted: the hard link's first name holds the data, the second links to it.
    assert bottom["bin/hardlink"].mode == 0o755 and bottom["bin/alias"].linkname == "tool"
    assert bottom["bin/tool"].islnk() and bottom["bin/tool"].linkname == "bin/hardlink"
    assert all(m.mtime == 0 and m.uid == 0 and m.uname == "" for m in bottom.values())
    assert sorted(top) == ["etc", "etc/motd"]


def test_packing_is_deterministic(tmp_path: Path) -> None:
    first = _write(tmp_path / "a")
    copy = tmp_path / "b"
    _tree(copy / "l1")
    _top(copy / "l2")
    # Other mtimes and another owner: the same archive, byte for byte.
    os.utime(copy / "l1/bin/tool", (1_000_000, 1_000_000))
    os.chown(copy / "l2/etc/motd", 1234, 1234)
    second = copy / "out.tar"
    write_image(
        second,
        "trainer:1.0",
        [copy / "l1", copy / "l2"],
        entrypoint=["/bin/tool"],
        cmd=["--help"],
        env={"PATH": "/bin", "MODE": "a=b"},
        workdir="/work",
    )
    assert first.read_bytes() == second.read_bytes()


def _member(archive: tarfile.TarFile, name: str) -> bytes:
    data = archive.extractfile(name)
    assert data is not None
    return data.read()


def test_the_archive_has_both_layouts(tmp_path: Path) -> None:
    path = _write(tmp_path)
    with tarfile.open(path) as archive:
        names = set(archive.getnames())
        manifest = json.loads(_member(archive, "manifest.json"))
        top = json.loads(_member(archive, "repositories"))["trainer"]["1.0"]
        top_json = json.loads(_member(archive, f"{top}/json"))
        bottom_json = json.loads(_member(archive, f"{top_json['parent']}/json"))
        version = _member(archive, f"{top}/VERSION")
    assert manifest[0]["RepoTags"] == ["trainer:1.0"]
    assert manifest[0]["Layers"][-1] == f"{top}/layer.tar"
    assert manifest[0]["Config"] in names
    assert "parent" not in bottom_json and version == b"1.0"
    assert top_json["config"]["Entrypoint"] == ["/bin/tool"]


def _without_manifest(path: Path, out: Path) -> Path:
    """``path`` as the legacy layout alone (what older ``docker save`` wrote)."""
    with tarfile.open(path) as src, tarfile.open(out, "w") as dst:
        for member in src.getmembers():
            if "/" not in member.name and member.name.endswith(".json"):
                continue  # manifest.json and the image config
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    return out


def test_the_legacy_layout_alone_reads_the_same(tmp_path: Path) -> None:
    path = _write(tmp_path)
    legacy = read_image(_without_manifest(path, tmp_path / "legacy.tar"))
    modern = read_image(path)
    assert legacy.config == modern.config
    assert [layer.digest for layer in legacy.layers] == [layer.digest for layer in modern.layers]
    assert [layer.id for layer in legacy.layers] == [layer.id for layer in modern.layers]


def test_an_archive_of_several_images_needs_a_name(tmp_path: Path) -> None:
    one = _write(tmp_path / "one", "a:1")
    two = _write(tmp_path / "two", "b:2")
    both = tmp_path / "both.tar"
    with tarfile.open(both, "w") as out:
        manifests = []
        for path in (one, two):
            with tarfile.open(path) as src:
                for member in src.getmembers():
                    if member.name == "manifest.json":
                        manifests += json.loads(_member(src, member.name))
                    elif member.name != "repositories" and member.name not in out.getnames():
                        out.addfile(member, src.extractfile(member) if member.isfile() else None)
        data = json.dumps(manifests).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        out.addfile(info, io.BytesIO(data))
    assert read_image(both, "b:2").reference == "b:2"
    assert read_image(both, "b:2").layers[0].digest == read_image(two).layers[0].digest
    with pytest.raises(ImageError, match="holds 2 images"):
        read_image(both)
    with pytest.raises(ImageError, match="has no image 'c'"):
        read_image(both, "c")


def test_bad_archives_and_references_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar")
    with pytest.raises(ImageError, match="not a readable image archive"):
        read_image(junk)
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass
    with pytest.raises(ImageError, match=r"neither 'manifest\.json' nor 'repositories'"):
        read_image(empty)
    with pytest.raises(ImageError, match="digest references"):
        parse_reference("trainer@sha256:abc")
    with pytest.raises(ImageError, match="at least one layer"):
        write_image(tmp_path / "x.tar", "x", [])


_NAME = st.from_regex(r"[a-z0-9]+([._-][a-z0-9]+)*", fullmatch=True)
_TAG = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
_REGISTRY = st.one_of(
    st.just(""),
    st.builds(lambda h, p: f"{h}:{p}/", _NAME, st.integers(1, 65535)),
    st.builds(lambda h: f"{h}.example/", _NAME),
)


@given(_REGISTRY, st.lists(_NAME, min_size=1, max_size=3), st.one_of(st.none(), _TAG))
def test_a_reference_splits_into_repository_and_tag(
    registry: str, path: list[str], tag: str | None
) -> None:
    repository = registry + "/".join(path)
    reference = repository if tag is None else f"{repository}:{tag}"
    assert parse_reference(reference) == (repository, tag or DEFAULT_TAG)
