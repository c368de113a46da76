"""models.model_hash: hashed once per run (cached by file stat), a changed file still detected."""

import hashlib
import os
import shutil

import pytest

from eagle3nb.target import models


def _by_hand(folder):
    h = hashlib.sha256()
    for f in sorted([folder / "config.json", *folder.glob("*.safetensors")]):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def model_copy(tmp_path):
    src = models.resolve_model("stories260K-hd32")
    dst = tmp_path / "m"
    shutil.copytree(src, dst)
    for f in dst.iterdir():
        f.chmod(0o644)
    models._HASH_MEMO.clear()
    yield dst
    models._HASH_MEMO.clear()


def test_hash_cached_in_run_dir_and_reused_by_other_processes(model_copy, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    h = models.model_hash(model_copy, run)
    assert h == _by_hand(model_copy) and (run / "model_sha256.json").is_file()
    models._HASH_MEMO.clear()  # another notebook's kernel: only the run folder's cache is shared

    def no_reading(files):
        raise AssertionError("weights were read again")

    monkeypatch.setattr(models, "_sha256_files", no_reading)
    assert models.model_hash(model_copy, run) == h
    assert models.model_hash(model_copy) == h  # and in memory for this process


@pytest.mark.parametrize("change", ["same size, mtime set back", "file replaced", "file added"])
def test_changed_file_is_detected(model_copy, tmp_path, change):
    run = tmp_path / "run"
    run.mkdir()
    h0 = models.model_hash(model_copy, run)
    w = model_copy / "model.safetensors"
    st = w.stat()
    if change == "same size, mtime set back":
        raw = bytearray(w.read_bytes())
        raw[-3] ^= 0x01
        with open(w, "r+b") as f:  # in place: same inode, same size
            f.write(bytes(raw))
        os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))  # ctime still moves
    elif change == "file replaced":
        raw = bytearray(w.read_bytes())
        raw[-3] ^= 0x01
        (model_copy / "x.tmp").write_bytes(bytes(raw))
        os.replace(model_copy / "x.tmp", w)
    else:
        (model_copy / "extra.safetensors").write_bytes(b"\0" * 16)
    h1 = models.model_hash(model_copy, run)
    assert h1 != h0 and h1 == _by_hand(model_copy)
