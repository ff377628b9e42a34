"""Archive extraction refuses members that would land outside the destination; nothing is left behind."""

import io
import tarfile
import zipfile

import pytest

from infra.archives import extract_tar, extract_zip
from infra.errors import SourceError


def _tar(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, target in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = b"hello"
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, target
                tar.addfile(info)
            elif kind == "device":
                info.type = tarfile.CHRTYPE
                tar.addfile(info)


def test_a_clean_tar_extracts_with_its_internal_links(tmp_path):
    _tar(tmp_path / "ok.tar.gz", [("usr/share/doc/a.txt", "file", None),
                                  ("usr/share/doc/b.txt", "symlink", "a.txt")])
    names = extract_tar(tmp_path / "ok.tar.gz", tmp_path / "out")
    assert names == ["usr/share/doc/a.txt", "usr/share/doc/b.txt"]
    assert (tmp_path / "out/usr/share/doc/b.txt").read_text() == "hello"


@pytest.mark.parametrize("member, why", [
    (("/etc/passwd", "file", None), "absolute path"),
    (("../../escape.txt", "file", None), "outside the destination"),
    (("docs/link", "symlink", "../../../etc/shadow"), "outside the destination"),
    (("docs/abs", "symlink", "/etc/shadow"), "absolute path"),
    (("docs/hard", "hardlink", "/etc/shadow"), "absolute path"),
    (("dev/sda", "device", None), "special file"),
])
def test_escaping_tar_members_are_refused_and_nothing_is_written(tmp_path, member, why):
    _tar(tmp_path / "bad.tar.gz", [("usr/share/doc/fine.txt", "file", None), member])
    with pytest.raises(SourceError, match=why):
        extract_tar(tmp_path / "bad.tar.gz", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.tar.gz"]  # no staging folder left behind


def test_tar_from_a_stream(tmp_path):
    _tar(tmp_path / "ok.tar.gz", [("a/b.txt", "file", None)])
    with open(tmp_path / "ok.tar.gz", "rb") as stream:
        assert extract_tar(stream, tmp_path / "out", name="ok") == ["a/b.txt"]


@pytest.mark.parametrize("name, why", [("/abs.txt", "absolute"), ("a/../../up.txt", "outside"),
                                       ("C:/windows.txt", "absolute")])
def test_escaping_zip_members_are_refused(tmp_path, name, why):
    with zipfile.ZipFile(tmp_path / "bad.zip", "w") as z:
        z.writestr("fine.txt", "x")
        z.writestr(name, "x")
    with pytest.raises(SourceError, match=why):
        extract_zip(tmp_path / "bad.zip", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with zipfile.ZipFile(tmp_path / "good.zip", "w") as z:
        z.writestr("docs/fine.txt", "x")
    assert extract_zip(tmp_path / "good.zip", tmp_path / "out") == ["docs/fine.txt"]
    assert (tmp_path / "out/docs/fine.txt").read_text() == "x"


def test_not_an_archive(tmp_path):
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 10)
    with pytest.raises(SourceError, match="not a readable tar"):
        extract_tar(tmp_path / "junk.tar", tmp_path / "out")
    with pytest.raises(SourceError, match="not a readable zip"):
        extract_zip(tmp_path / "junk.tar", tmp_path / "out")


@pytest.mark.parametrize("name, mode", [("c.tar.gz", "w:gz"), ("c.tar.xz", "w:xz")])
def test_damaged_compressed_tar_is_a_source_error_not_a_crash(tmp_path, name, mode):
    import os

    with tarfile.open(tmp_path / name, mode) as tar:
        for i in range(20):
            data = os.urandom(4000)
            info = tarfile.TarInfo(f"d/{i}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = (tmp_path / name).read_bytes()
    (tmp_path / name).write_bytes(raw[: len(raw) // 2])  # truncated: the decompressor raises EOFError
    with pytest.raises(SourceError, match="not a readable tar archive"):
        extract_tar(tmp_path / name, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_zip_with_encrypted_or_unknown_compression_members_is_a_source_error(tmp_path):
    with zipfile.ZipFile(tmp_path / "a.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("d/a.txt", "hello " * 100)
    raw = bytearray((tmp_path / "a.zip").read_bytes())
    central = raw.find(b"PK\x01\x02")
    encrypted = bytearray(raw)
    encrypted[central + 8] |= 1  # general-purpose flag bit 0: encrypted
    (tmp_path / "enc.zip").write_bytes(bytes(encrypted))
    with pytest.raises(SourceError, match="enc.zip: not a readable zip archive .*encrypted"):
        extract_zip(tmp_path / "enc.zip", tmp_path / "out")
    unknown = bytearray(raw)
    local = unknown.find(b"PK\x03\x04")
    unknown[local + 8:local + 10] = unknown[central + 10:central + 12] = (99).to_bytes(2, "little")
    (tmp_path / "method.zip").write_bytes(bytes(unknown))
    with pytest.raises(SourceError, match="method.zip: not a readable zip archive"):
        extract_zip(tmp_path / "method.zip", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_members_that_collide_are_a_source_error_not_a_crash(tmp_path):
    import io
    import tarfile
    import zipfile

    from infra.archives import extract_tar, extract_zip
    from infra.errors import SourceError

    zipped = tmp_path / "clash.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("a", "a file")
        archive.writestr("a/b", "below the file")
    with pytest.raises(SourceError, match="collide"):
        extract_zip(zipped, tmp_path / "z")
    tarred = tmp_path / "clash.tar.gz"
    with tarfile.open(tarred, "w:gz") as archive:
        for name in ("a", "a/b"):
            info = tarfile.TarInfo(name)
            info.size = 3
            archive.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(SourceError, match="collide"):
        extract_tar(tarred, tmp_path / "t")
    assert not (tmp_path / "z").exists() and not (tmp_path / "t").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clash.tar.gz", "clash.zip"]
