"""eagle3nb.dataset.shard_file: the shard writer against safetensors' own serializer (the same
bytes), its sha256 against hashlib over the file, all_finite against torch.isfinite. The writer
thread's integrity is tested in test_integrity.py."""

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save

import eagle3nb.dataset.shard_file as sf
from eagle3nb.dataset.layout import ST_DTYPES


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "aux": torch.randn(5, 6, generator=g).to(torch.bfloat16),
        "final": torch.randn(5, 2, generator=g),
        "input_ids": torch.arange(5),
        "loss_mask": torch.tensor([0, 1, 1, 0, 1], dtype=torch.uint8),
        "empty": torch.zeros(0, 3),
        "half": torch.randn(3, generator=g).half(),
        "q": torch.tensor([[1, -2], [127, -127]], dtype=torch.int8),
        "zz": torch.tensor(7),  # a 0-d tensor
    }


@pytest.mark.parametrize("metadata", [None, {"format": "eagle3nb-aux-dataset"}])
def test_bytes_equal_safetensors_own_serializer(tmp_path, metadata):
    t = _tensors()
    sha = sf.write_safetensors(t, tmp_path / "x.safetensors", metadata)
    got = (tmp_path / "x.safetensors").read_bytes()
    assert got == save(t, metadata=metadata)  # the library's bytes for the same tensors
    assert sha == hashlib.sha256(got).hexdigest()
    back = load_file(tmp_path / "x.safetensors")
    assert back.keys() == t.keys() and all(torch.equal(back[k], t[k]) for k in t)


def test_metadata_keys_sorted_and_read_back(tmp_path):
    md = {"zeta": "1", "alpha": "2"}
    sf.write_safetensors(_tensors(), tmp_path / "x.safetensors", md)
    raw = (tmp_path / "x.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    head = json.loads(raw[8 : 8 + n])
    assert list(head["__metadata__"]) == ["alpha", "zeta"]  # the library's order varies
    lib = save(_tensors(), metadata=md)
    m = int.from_bytes(lib[:8], "little")
    assert json.loads(lib[8 : 8 + m]) == head and lib[8 + m :] == raw[8 + n :]


def test_large_tensor_crosses_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(sf, "_CHUNK", 1000)  # many write/hash steps, one ending mid-element
    t = {"a": torch.randn(333, 7), "b": torch.arange(1001, dtype=torch.int64)}
    sha = sf.write_safetensors(t, tmp_path / "x.safetensors")
    assert (tmp_path / "x.safetensors").read_bytes() == save(t)
    assert sha == hashlib.sha256(save(t)).hexdigest()


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"a": torch.zeros(2, 3).t()}, "contiguous=False"),
        ({"a": torch.zeros(2, dtype=torch.complex64)}, "complex64"),
        ({"a": torch.zeros(2, dtype=torch.bool)}, "torch.bool"),
    ],
)
def test_refuses_what_it_cannot_write(tmp_path, bad, match):
    assert set(ST_DTYPES) >= {torch.bfloat16, torch.float32, torch.int64, torch.uint8}
    with pytest.raises(ValueError, match=match):
        sf.write_safetensors(bad, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="metadata"):
        sf.write_safetensors({"a": torch.zeros(1)}, tmp_path / "y.safetensors", {"k": 1})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_all_finite_matches_isfinite(dtype):
    big = torch.finfo(dtype).max
    x = torch.ones(64, 8, dtype=dtype)
    cases = {"ones": x}
    for name, v in [("nan", float("nan")), ("inf", float("inf")), ("-inf", float("-inf"))]:
        y = x.clone()
        y[17, 3] = v
        cases[name] = y
    y = x.clone()
    y[0, 0], y[5, 5] = float("inf"), float("-inf")  # the sum is NaN, not inf
    cases["inf and -inf"] = y
    cases["finite, sum overflows"] = torch.full((64, 8), big, dtype=dtype)
    cases["empty"] = torch.zeros(0, 8, dtype=dtype)
    for name, y in cases.items():
        assert sf.all_finite(y) == bool(torch.isfinite(y).all()), name
    assert sf.all_finite(cases["finite, sum overflows"])  # a sum that overflowed is re-checked
    assert sf.all_finite(torch.arange(5))
