"""Disk estimate against the bytes actually written; int8 aux storage round trip and its error."""

import json

import numpy as np
import pytest
import torch

from eagle3nb.target.capture import HFCaptureEngine
from eagle3nb.dataset.read import AuxDataset
from eagle3nb.dataset.write import shard_plan, write_dataset
from eagle3nb.dataset.layout import (
    WRITER_SHARDS_IN_MEMORY,
    check_writer_memory,
    dequantize_aux,
    estimate_dataset_bytes,
    quantize_aux,
    shard_file_bytes,
    shard_layout,
)

TEXTS = [
    "Once upon a time there was a cat.",
    "Tom had a big red ball and a dog.",
    "The sun was warm.",
    "Mia liked to sing songs with her mom.",
    "Ben ran to the park.",
    "Lily saw a bird in the tree and she smiled.",
]
MAN = {
    "target": {"name": "stories260K-hd32"},
    "engine": {"name": "hf-transformers"},
    "convention": "sglang",
    "layer_ids": [0, 1, 3],
    "aux_boundaries": [1, 2, 4],
    "final_boundary": 5,
    "template": {"mode": "completion"},
}


def _samples(tok):
    out = []
    for i, t in enumerate(TEXTS):
        ids = tok(t).input_ids
        mask = (
            [0] * len(ids) if i == 2 else [0] * 3 + [1] * (len(ids) - 3)
        )  # sample 2: empty loss mask, skipped
        out.append((i, ids, mask))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("aux_storage", ["dtype", "int8"])
def test_estimate_equals_bytes_written(target, tmp_path, dtype, aux_storage):
    model, tok, _ = target
    eng = HFCaptureEngine(model, "sglang")
    s = _samples(tok)
    H, n_aux = model.config.hidden_size, 3
    lens = [[len(x[1]) for x in chunk if any(x[2])] for _, chunk in shard_plan(s, 4)]
    est = estimate_dataset_bytes(lens, n_aux, H, dtype, aux_storage)
    man = write_dataset(
        tmp_path / "ds",
        s,
        lambda xs: eng.capture(xs, [0, 1, 3]),
        dict(MAN, dtype=str(dtype)),
        shard_size=4,
        dtype=dtype,
        aux_storage=aux_storage,
    )
    sizes = [(tmp_path / "ds" / sh["file"]).stat().st_size for sh in man["shards"]]
    assert est["shard_bytes"] == sum(sizes)  # exact, headers included
    assert est["largest_shard_bytes"] == max(sizes)
    for sh, ls, size in zip(man["shards"], lens, sizes):
        assert shard_file_bytes(shard_layout(ls, n_aux, H, dtype, aux_storage)) == size, sh["file"]
    # the formula of the docs, by hand: payload per token, plus ids/offsets per sample, plus headers
    b = 4 if dtype == torch.float32 else 2
    per_tok = (n_aux * H * 1 + n_aux * 4 + H * b) if aux_storage == "int8" else (n_aux + 1) * H * b
    n_tok, n_smp = sum(map(sum, lens)), sum(map(len, lens))
    payload = n_tok * (per_tok + 9) + n_smp * 16 + len(lens) * 8
    assert est["per_token_bytes"] == per_tok + 9
    assert (
        0 < sum(sizes) - payload < len(lens) * 1024
    )  # the rest is the JSON headers (a few hundred B each)


def test_int8_round_trip_bound_by_hand():
    g = torch.Generator().manual_seed(0)
    n_aux, H = 3, 16
    x = (
        torch.randn(50, n_aux * H, generator=g) * torch.logspace(-3, 3, 50)[:, None]
    )  # magnitudes over 6 decades
    x[7, H : 2 * H] = 0  # an all-zero slot
    x[9, 5] = 1e4  # an outlier dominates its slot's scale
    q, scale = quantize_aux(x, n_aux)
    y = dequantize_aux(q, scale)
    assert q.dtype == torch.int8 and scale.shape == (50, n_aux) and scale.dtype == torch.float32
    xn = x.numpy().astype(np.float64).reshape(50, n_aux, H)
    absmax = np.abs(xn).max(axis=-1)  # independent: per token and slot
    np.testing.assert_allclose(scale.numpy(), absmax / 127, rtol=1e-6)
    err = np.abs(xn - y.numpy().astype(np.float64).reshape(50, n_aux, H))
    assert (err <= absmax[..., None] / 254 * (1 + 1e-5) + 1e-30).all()  # half a quantisation step
    assert torch.equal(y[7, H : 2 * H], torch.zeros(H))
    assert (q.reshape(50, n_aux, H).abs().amax(-1)[absmax > 0] == 127).all()  # the range is used


def test_int8_dataset_error_recorded_and_loader_dequantises(target, tmp_path):
    model, tok, _ = target
    eng = HFCaptureEngine(model, "sglang")
    s = _samples(tok)
    man = write_dataset(
        tmp_path / "q",
        s,
        lambda xs: eng.capture(xs, [0, 1, 3]),
        dict(MAN, dtype="float32"),
        shard_size=4,
        aux_storage="int8",
    )
    ds = AuxDataset(tmp_path / "q")
    assert (
        man["aux_storage"] == "int8"
        and json.loads((tmp_path / "q" / "manifest.json").read_text())["aux_quantization"]
        == man["aux_quantization"]
    )
    kept = [x for x in s if any(x[2])]
    ref = {x[0]: c.aux for x, c in zip(kept, eng.capture([x[1] for x in kept], [0, 1, 3]))}
    num = den = 0.0
    per = np.zeros((3, 2))
    H = model.config.hidden_size
    for it in ds:
        a = it["aux"]
        assert a.dtype == torch.float32  # transparent: the loader hands out dequantised floats
        r = ref[it["sample_id"]].double().numpy()
        d = r - a.double().numpy()
        num, den = num + (d**2).sum(), den + (r**2).sum()
        for i in range(3):
            per[i] += [
                (d[:, i * H : (i + 1) * H] ** 2).sum(),
                (r[:, i * H : (i + 1) * H] ** 2).sum(),
            ]
        assert (
            np.abs(d).max() <= np.abs(r).max() / 254 * 1.001
        )  # never more than half a step of the largest slot
    rel = (num / den) ** 0.5
    q = man["aux_quantization"]
    assert q["relative_error"] == pytest.approx(
        rel, rel=1e-4, abs=1e-6
    )  # capture batches differ: float32 noise
    for i, b in enumerate([1, 2, 4]):
        assert q["relative_error_per_boundary"][str(b)] == pytest.approx(
            (per[i, 0] / per[i, 1]) ** 0.5, rel=1e-4, abs=1e-6
        )
    assert 0 < rel < 0.02  # int8 per-token absmax on this model: well under 2 %
    # final (boundary N) is stored unquantised: exactly the engine's float32 states
    fin = {x[0]: c.final for x, c in zip(kept, eng.capture([x[1] for x in kept], [0, 1, 3]))}
    for it in ds:
        torch.testing.assert_close(it["final"], fin[it["sample_id"]], atol=1e-5, rtol=1e-5)
    # memory-mapped reads dequantise per sample: the same floats as the in-memory whole-shard pass
    mm = AuxDataset(tmp_path / "q", mmap=True)
    for a, b in zip(ds, mm, strict=True):
        assert a["sample_id"] == b["sample_id"]
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "loss_mask", "aux", "final"))


def test_writer_memory_refusal_names_shard_size_and_a_size_that_fits():
    # 8 samples of 100 tokens per shard, H 64, 3 aux slots, float32: one shard's file by hand
    lens = [[100] * 8]
    one = estimate_dataset_bytes(lens, 3, 64, torch.float32)["largest_shard_bytes"]
    assert one == shard_file_bytes(shard_layout(lens[0], 3, 64, torch.float32))
    need = WRITER_SHARDS_IN_MEMORY * one
    check_writer_memory(one, 8, available=need)  # exactly enough: accepted
    avail = need * 3 // 8
    # suggested: floor(8 x 0.9 x 3/8) = floor(2.7) = 2 samples per shard
    with pytest.raises(ValueError, match=r"shard_size=8: .* set shard_size: 2 or less"):
        check_writer_memory(one, 8, available=avail)
    two = estimate_dataset_bytes([[100] * 2], 3, 64, torch.float32)["largest_shard_bytes"]
    check_writer_memory(two, 2, available=avail)  # the suggestion fits
    with pytest.raises(ValueError, match="each of the 2 writers"):
        check_writer_memory(one, 8, available=need, workers=2)
    with pytest.raises(ValueError, match="shorten the samples"):
        check_writer_memory(one, 1, available=one)
