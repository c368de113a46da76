"""eagle3nb.dataset.shard_file: the shard writer against safetensors' own serializer (the same
bytes), its sha256 against hashlib over the file, all_finite against torch.isfinite, and 02a's
writer thread: an engine error while a shard is being written keeps that shard."""

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save

import eagle3nb.dataset.shard_file as sf
from eagle3nb.dataset.layout import ST_DTYPES
from eagle3nb.dataset.read import AuxDataset
from eagle3nb.dataset.write import write_dataset
from eagle3nb.target.capture import Captured


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


SAMPLES = [(i, list(range(1, 5 + i)), [0] + [1] * (3 + i)) for i in range(6)]
MAN = {
    "target": {"name": "fake"},
    "engine": {"name": "fake-engine-for-tests"},
    "convention": "hf",
    "layer_ids": [1],
    "aux_boundaries": [1],
    "dtype": "float32",
    "template": {"mode": "completion"},
}


def fake_engine_capture(xs):
    """A fake engine (tests only): states are a function of the token ids."""
    return [
        Captured(
            aux=torch.tensor(x, dtype=torch.float32)[:, None].repeat(1, 2),
            final=-torch.tensor(x, dtype=torch.float32)[:, None].repeat(1, 2),
        )
        for x in xs
    ]


def test_engine_error_while_a_shard_is_written_keeps_that_shard(tmp_path, monkeypatch):
    """The third capture fails while shard 1 is on the writer thread: shard 1 must still be
    recorded in the manifest (it is complete on disk), and a rerun captures only shards 2..."""
    import eagle3nb.dataset.write as dsmod

    real, calls = dsmod.write_safetensors, []

    def slow_write(tensors, path, metadata=None):  # the write still running when capture fails
        import time

        time.sleep(0.3)
        return real(tensors, path, metadata)

    def fake_engine_failing_third(xs):
        calls.append(len(calls))
        if len(calls) == 3:
            raise RuntimeError("engine died")
        return fake_engine_capture(xs)

    monkeypatch.setattr(dsmod, "write_safetensors", slow_write)
    out = tmp_path / "ds"
    with pytest.raises(RuntimeError, match="engine died"):
        write_dataset(out, SAMPLES, fake_engine_failing_third, MAN, shard_size=2)
    m = json.loads((out / "manifest.json").read_text())
    assert [s["file"] for s in m["shards"]] == [
        "shard-00000.safetensors",
        "shard-00001.safetensors",
    ]
    for s in m["shards"]:
        assert s["sha256"] == hashlib.sha256((out / s["file"]).read_bytes()).hexdigest()
    again = []
    write_dataset(out, SAMPLES, lambda xs: again.append(1) or fake_engine_capture(xs), MAN, 2)
    assert len(again) == 1  # only the third shard
    ds = AuxDataset(out)
    ref = fake_engine_capture([s[1] for s in SAMPLES])
    assert sorted(x["sample_id"] for x in ds) == list(range(6))
    for x in ds:
        assert torch.equal(x["aux"], ref[x["sample_id"]].aux)
