"""eagle3nb.dataset write and read: round trip and resume, a corrupt shard named, other settings refused on resume,
non-finite / empty-mask samples skipped and counted, and pad_right."""

import pytest
import torch

from eagle3nb.target.capture import Captured, HFCaptureEngine
from eagle3nb.dataset.read import AuxDataset, collate
from eagle3nb.dataset.write import write_dataset
from eagle3nb.manifest import ManifestMismatch
from eagle3nb.padding import pad_right
from testkit import text_samples


TEXTS = [
    "Once upon a time there was a cat.",
    "Tom had a big red ball and a dog.",
    "The sun was warm.",
    "Mia liked to sing songs with her mom.",
    "Ben ran to the park.",
]
MAN = {
    "target": {"name": "stories260K-hd32"},
    "engine": {"name": "hf-transformers"},
    "convention": "sglang",
    "layer_ids": [0, 1, 3],
    "aux_boundaries": [1, 2, 4],
    "final_boundary": 5,
    "dtype": "float32",
    "template": {"mode": "completion"},
}


def test_write_read_round_trip_and_resume(target, tmp_path):
    model, tok, _ = target
    eng = HFCaptureEngine(model, "sglang")
    calls = []

    def capture(xs):
        calls.append(len(xs))
        return eng.capture(xs, [0, 1, 3])

    s = text_samples(tok, TEXTS)
    man = write_dataset(tmp_path / "ds", s, capture, MAN, shard_size=2)
    assert calls == [2, 2, 1] and man["complete"] and man["n_samples"] == 5
    ds = AuxDataset(tmp_path / "ds")
    ref = eng.capture([x[1] for x in s], [0, 1, 3])
    for i in range(5):
        assert ds[i]["input_ids"].tolist() == s[i][1] and ds[i]["loss_mask"].tolist() == s[i][2]
        torch.testing.assert_close(
            ds[i]["aux"], ref[i].aux, atol=1e-5, rtol=1e-5
        )  # batch shapes differ: float32 noise only
        torch.testing.assert_close(ds[i]["final"], ref[i].final, atol=1e-5, rtol=1e-5)
    # rerun after losing the last shard: only that shard is redone
    (tmp_path / "ds" / "shard-00002.safetensors").unlink()
    calls.clear()
    write_dataset(tmp_path / "ds", s, capture, MAN, shard_size=2)
    assert calls == [1] and len(AuxDataset(tmp_path / "ds")) == 5
    b = collate([ds[0], ds[2]])
    assert b["input_ids"].shape == (2, max(len(s[0][1]), len(s[2][1]))) and b[
        "attn_mask"
    ].sum() == len(s[0][1]) + len(s[2][1])


def test_corrupt_shard_is_named(target, tmp_path):
    model, tok, _ = target
    eng = HFCaptureEngine(model, "sglang")
    write_dataset(
        tmp_path / "ds",
        text_samples(tok, TEXTS),
        lambda xs: eng.capture(xs, [0, 1, 3]),
        MAN,
        shard_size=2,
    )
    f = tmp_path / "ds" / "shard-00001.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-5] ^= 0xFF
    f.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="shard-00001.safetensors is corrupt"):
        AuxDataset(tmp_path / "ds")
    f.unlink()
    with pytest.raises(ValueError, match="shard-00001.safetensors is listed in .* but missing"):
        AuxDataset(tmp_path / "ds")


def test_other_settings_refused_on_resume(target, tmp_path):
    model, tok, _ = target
    eng = HFCaptureEngine(model, "sglang")
    s = text_samples(tok, TEXTS)
    write_dataset(tmp_path / "ds", s, lambda xs: eng.capture(xs, [0, 1, 3]), MAN, shard_size=2)
    with pytest.raises(ManifestMismatch, match="layer_ids"):
        write_dataset(
            tmp_path / "ds",
            s,
            lambda xs: eng.capture(xs, [0, 1, 2]),
            dict(MAN, layer_ids=[0, 1, 2], aux_boundaries=[1, 2, 3]),
            shard_size=2,
        )


def test_nonfinite_and_empty_mask_samples_skipped_and_counted(tmp_path):
    def fake_engine_capture(xs):  # a fake engine (tests only): NaN rows for sample text length 4
        return [
            Captured(
                aux=torch.full((len(x), 6), float("nan")) if len(x) == 4 else torch.ones(len(x), 6),
                final=torch.ones(len(x), 2),
            )
            for x in xs
        ]

    s = [(0, [1, 2, 3], [0, 1, 1]), (1, [1, 2, 3, 4], [0, 1, 1, 1]), (2, [1, 5], [0, 0])]
    man = write_dataset(tmp_path / "ds", s, fake_engine_capture, MAN, shard_size=8)
    assert man["skipped"] == {"nonfinite": [1], "empty_loss_mask": [2]} and man["n_samples"] == 1


def test_pad_right_stacks_ragged_samples_with_a_mask():
    ids, mask = pad_right([[5, 6, 7], [8], []])  # token id lists -> int64
    assert ids.dtype == mask.dtype == torch.long
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    x = [torch.ones(2, 3, dtype=torch.bfloat16), torch.full((4, 3), 2.0, dtype=torch.bfloat16)]
    out, m = pad_right(x, pad_value=-1, dtype=torch.float32)  # [B, L, *rest], cast into dtype
    assert out.shape == (2, 4, 3) and out.dtype == torch.float32 and m.sum(1).tolist() == [2, 4]
    assert torch.equal(out[0, :2], x[0].float()) and (out[0, 2:] == -1).all()
    u8 = pad_right([torch.arange(3, dtype=torch.uint8)])[0]
    assert u8.dtype == torch.uint8  # default dtype: the first sample's
    with pytest.raises(ValueError, match="no samples"):
        pad_right([])
    with pytest.raises(ValueError, match="differ in trailing shapes"):
        pad_right([torch.zeros(2, 3), torch.zeros(2, 4)])
