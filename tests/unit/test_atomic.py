"""infra.atomic: a write is whole or absent, a killed writer leaves only a hidden temporary, concurrent writers of one
path never mix their bytes."""

import subprocess
import sys
import threading
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infra.atomic import (TEMP_MARK, atomic_dir, atomic_file, atomic_write_bytes, atomic_write_text, publish_dir,
                          remove_temps, temp_path)

REPO = Path(__file__).resolve().parents[2]


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_writes_replace_the_content_and_leave_nothing_else(tmp_path):
    target = tmp_path / "data.bin"
    atomic_write_bytes(target, b"old")
    atomic_write_bytes(target, b"new bytes")
    assert target.read_bytes() == b"new bytes"
    atomic_write_text(tmp_path / "note.txt", "caf\u00e9\n", durable=False)
    assert (tmp_path / "note.txt").read_bytes() == "caf\u00e9\n".encode()
    assert _names(tmp_path) == ["data.bin", "note.txt"]


def test_a_handle_writer_gives_the_bytes_a_path_writer_gives(tmp_path):
    frame = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    frame.to_parquet(tmp_path / "by_path.parquet", index=False)
    with atomic_file(tmp_path / "by_handle.parquet") as f:
        frame.to_parquet(f, index=False)
    assert (tmp_path / "by_handle.parquet").read_bytes() == (tmp_path / "by_path.parquet").read_bytes()
    with atomic_file(tmp_path / "a.npy") as f:
        np.save(f, np.arange(5), allow_pickle=False)
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.arange(5))


def test_a_failure_mid_write_keeps_the_old_content_and_no_temporary(tmp_path):
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="mid-write"):
        with atomic_file(target) as f:
            f.write(b"half of the n")
            raise RuntimeError("mid-write")
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["data.bin"]
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(target, "\u00e9", encoding="ascii")
    assert target.read_bytes() == b"old" and _names(tmp_path) == ["data.bin"]


def test_a_missing_folder_or_a_bad_mode_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic_write_bytes(tmp_path / "absent" / "x.bin", b"x")
    with pytest.raises(ValueError, match="mode"):
        with atomic_file(tmp_path / "x.bin", "ab"):
            pass
    assert _names(tmp_path) == []


def _killed_writer(code: str, tmp_path: Path) -> None:
    """Run ``code`` in a child that dies by os._exit inside the write: no cleanup runs, as after SIGKILL."""
    script = textwrap.dedent(code).format(tmp=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr


def test_a_killed_file_writer_leaves_only_a_hidden_temporary(tmp_path):
    target = tmp_path / "shard.bin"
    target.write_bytes(b"old")
    _killed_writer("""
        import os
        from infra.atomic import atomic_file
        with atomic_file("{tmp}/shard.bin") as f:
            f.write(b"torn")
            f.flush()
            os._exit(3)
    """, tmp_path)
    assert target.read_bytes() == b"old"
    leftovers = [p for p in tmp_path.iterdir() if p != target]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(f".shard.bin{TEMP_MARK}")
    assert leftovers[0].read_bytes() == b"torn"
    assert list(tmp_path.glob("*.bin")) == [target]  # a suffix glob never takes the temporary for a shard
    assert remove_temps(target) == leftovers and _names(tmp_path) == ["shard.bin"]


def test_a_directory_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "a.txt").write_text("a")
            raise RuntimeError("mid-write")
    assert _names(tmp_path) == []
    with atomic_dir(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(f".out{TEMP_MARK}")
        (tmp / "a.txt").write_text("a")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text("b")
        assert not target.exists()
    assert (target / "sub" / "b.txt").read_text() == "b" and _names(tmp_path) == ["out"]


def test_replacing_a_directory_swaps_it_whole(tmp_path):
    target = tmp_path / "audit"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(target, replace=True) as tmp:
            (tmp / "new.txt").write_text("new")
            raise RuntimeError("mid-write")
    assert _names(target) == ["old.txt"] and _names(tmp_path) == ["audit"]
    with atomic_dir(target, replace=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert _names(target) == ["new.txt"] and _names(tmp_path) == ["audit"]


def test_without_replace_the_first_finished_directory_is_kept(tmp_path):
    target = tmp_path / "cache"
    with atomic_dir(target) as first:
        (first / "who").write_text("first")
        with atomic_dir(target) as second:
            (second / "who").write_text("second")
    # second finished first and is kept; first was discarded whole
    assert (target / "who").read_text() == "second" and _names(tmp_path) == ["cache"]
    temp = tmp_path / ".other.tmp-x"
    temp.mkdir()
    target_file = tmp_path / "a_file"
    target_file.write_text("x")
    with pytest.raises(OSError):  # a file in the way is an error, not a lost race
        publish_dir(temp, target_file)


def test_a_killed_directory_writer_leaves_a_hidden_temporary_that_the_next_writer_can_clear(tmp_path):
    _killed_writer("""
        import os
        from infra.atomic import atomic_dir
        with atomic_dir("{tmp}/00002") as tmp:
            (tmp / "units.parquet").write_text("torn")
            os._exit(3)
    """, tmp_path)
    assert not (tmp_path / "00002").exists()
    (leftover,) = tmp_path.iterdir()
    assert leftover.name.startswith(f".00002{TEMP_MARK}")
    with atomic_dir(tmp_path / "00002", clear_stale=True) as tmp:
        (tmp / "units.parquet").write_text("whole")
    assert _names(tmp_path) == ["00002"] and (tmp_path / "00002" / "units.parquet").read_text() == "whole"


def test_temporary_names_are_unique_per_writer(tmp_path):
    names = {temp_path(tmp_path / "x").name for _ in range(200)}
    assert len(names) == 200 and all(n.startswith(f".x{TEMP_MARK}") for n in names)


def test_concurrent_writers_of_one_path_never_mix_their_bytes(tmp_path):
    """Threads here and processes there write one path in chunks while it is read: every read is one whole
    payload."""
    target = tmp_path / "shared.bin"
    payloads = {bytes([i]) * 200_000 for i in range(6)}
    atomic_write_bytes(target, bytes([0]) * 200_000)
    stop, seen, errors = threading.Event(), set(), []

    def reader():
        while not stop.is_set():
            seen.add(target.read_bytes())

    def writer(i: int):
        try:
            for _ in range(15):
                with atomic_file(target, durable=i % 2 == 0) as f:
                    for _ in range(20):
                        f.write(bytes([i]) * 10_000)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    script = textwrap.dedent("""
        import sys
        from infra.atomic import atomic_file
        i = int(sys.argv[1])
        for _ in range(15):
            with atomic_file("{target}", durable=False) as f:
                for _ in range(20):
                    f.write(bytes([i]) * 10_000)
    """).format(target=target)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i)], cwd=REPO) for i in (4, 5)]
    threads = [threading.Thread(target=reader)] + [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    stop.set()
    threads[0].join()
    assert not errors
    assert seen <= payloads and target.read_bytes() in payloads
    assert _names(tmp_path) == ["shared.bin"]
