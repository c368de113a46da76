"""Online training (the target captures each batch) equals offline training on the same data."""

import pytest
import torch
from testkit import ONLINE_TEXTS, TINY_MANIFEST, same_weights

from eagle3nb.dataset.read import AuxDataset
from eagle3nb.dataset.write import write_dataset
from eagle3nb.target.capture import HFCaptureEngine
from eagle3nb.training.loop import TrainConfig, train_drafter
from eagle3nb.training.online import OnlineSource

TEXTS = ONLINE_TEXTS + ["Hi."]
MAN = TINY_MANIFEST
CFG = TrainConfig(
    batch_size=3,
    max_steps=30,
    warmup_steps=3,
    ttt_steps=3,
    draft_vocab_size=128,
    draft_num_heads=0,
    draft_num_kv_heads=0,
    log_every=1,
    aux_noise=0.1,
)


def _samples(tok):
    out = []
    for i, t in enumerate(TEXTS):
        ids = tok(t).input_ids
        mask = (
            [0] * len(ids) if t == "Hi." else [0] * 3 + [1] * (len(ids) - 3)
        )  # "Hi.": empty loss mask, skipped by both
        out.append((i, ids, mask))
    return out


@pytest.mark.parametrize("capture_batch", [16, 1])
def test_online_training_equals_offline(target, tmp_path, capture_batch):
    """Tolerance: offline states come from capture batches of ``capture_batch`` samples, online ones
    from the training batches; float32 matmuls over other batch shapes may round differently (a few
    ulp, ~1e-7 relative; measured here: 0 with batches of 16, 3e-7 in the loss and 1.2e-7 in the
    weights unpadded). Adam normalises each update, so 30 steps do not amplify that; 1e-5 relative on
    the loss and 1e-5 absolute on weights of magnitude up to ~300 leave room for another CPU's BLAS and
    are still far below any real difference (a one-boundary shift changes the loss by > 1 %)."""
    model, tok, _ = target
    s = _samples(tok)
    eng = HFCaptureEngine(model, "sglang", batch_size=capture_batch)
    write_dataset(tmp_path / "ds", s, lambda xs: eng.capture(xs, [0, 1, 3]), MAN, shard_size=3)
    off = AuxDataset(tmp_path / "ds")
    on = OnlineSource(
        s, model, [0, 1, 3], "sglang", {k: MAN[k] for k in ("target", "dtype", "template")}
    )
    # same samples, same order
    assert [x["sample_id"] for x in on.items] == [x["sample_id"] for x in off]
    assert (
        on.manifest["aux_boundaries"] == off.manifest["aux_boundaries"]
        and on.manifest["n_tokens"] == off.manifest["n_tokens"]
    )
    d_off, r_off = train_drafter(off, model, CFG, tmp_path / "off")
    d_on, r_on = train_drafter(on, model, CFG, tmp_path / "on")
    assert on.captured_tokens > 0 and on.capture_seconds > 0  # the target really ran in the loop
    assert r_on["vocab"] == r_off["vocab"]
    assert r_off["history"][-1]["loss"] < 0.5 * r_off["history"][0]["loss"]  # it learnt something
    for a, b in zip(r_off["history"], r_on["history"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), a["step"]
        assert b["step_acc"] == pytest.approx(a["step_acc"], abs=1e-6), a["step"]
    same_weights(d_off, d_on, atol=1e-5)


def test_online_batch_equals_stored_collate(target, tmp_path):
    """One online batch against the stored dataset collated: the same tensors (padding zeroed)."""
    from eagle3nb.dataset.read import collate

    model, tok, _ = target
    s = _samples(tok)
    eng = HFCaptureEngine(model, "sglang")
    write_dataset(tmp_path / "ds", s, lambda xs: eng.capture(xs, [0, 1, 3]), MAN, shard_size=8)
    off = AuxDataset(tmp_path / "ds")
    on = OnlineSource(s, model, [0, 1, 3], "sglang", {})
    idx = [4, 0, 2]
    a, b = collate([off[i] for i in idx]), on.batch(idx, "cpu")
    assert set(a) == set(b)
    for k in a:
        assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5, msg=k)
    wrong = OnlineSource(s, model, [1, 2, 3], "sglang", {}).batch(
        idx, "cpu"
    )  # boundaries [2, 3, 4]
    assert (wrong["aux"] - a["aux"]).abs().max() > 0.1  # the comparison can fail


@pytest.mark.slow  # over 20 s on a 2-core box (2026-12-04)
def test_run_online_skips_extraction_and_trains(tmp_path):
    """The CLI driver with training_mode online: 01, 03, 04 run, no dataset is written."""
    import json

    from eagle3nb.params import load_params
    from eagle3nb.run import run_notebooks
    from eagle3nb.repo_paths import REPO_ROOT

    root = run_notebooks(
        REPO_ROOT / "params" / "smoke.yaml",
        overrides={
            "outputs_dir": str(tmp_path),
            "run_name": "online",
            "training_mode": "online",
            "drift_matrix": False,  # 05 is its own concern (test_pipeline runs it)
            "eval_engines": ["simulator"],  # served acceptance: test_pipeline
        },
    )
    assert (
        not (root / "dataset").exists()
        and not (root / "notebooks" / "02b_extract_sglang.ipynb").exists()
    )
    m = json.loads((root / "metrics.json").read_text())
    assert (
        "extract" not in m
        and m["train"]["training_mode"] == "online"
        and m["train"]["steps"] == load_params(REPO_ROOT / "params" / "smoke.yaml").max_steps
    )
    assert (
        m["train"]["online"]["target_capture_seconds"] > 0
        and m["timing"]["training_mode"] == "online"
    )
    assert sorted(m["timing"]["notebook_seconds"]) == [
        "01_generate",
        "03_train",
        "04_eval_acceptance",
    ]
    assert m["eval"]["greedy_mismatches"] == 0
    dman = json.loads((root / "drafter" / "manifest.json").read_text())
    assert (
        dman["training_mode"] == "online"
        and dman["dataset_engine"]["online"]
        and dman["aux_boundaries"] == [1, 2, 4]
    )


def test_nonfinite_samples_equals_the_elementwise_check():
    from eagle3nb.training.online import nonfinite_samples

    g = torch.Generator().manual_seed(0)
    aux, final = torch.randn(6, 5, 12, generator=g) * 1e3, torch.randn(6, 5, 4, generator=g)
    aux[1, 2, 3] = float("nan")
    aux[2, 0, 0] = float("inf")
    aux[3, 4, 1], aux[3, 4, 2] = float("inf"), float("-inf")  # their sum is NaN
    final[4, 1, 1] = float("-inf")
    want = ~(torch.isfinite(aux).all(-1).all(-1) & torch.isfinite(final).all(-1).all(-1))
    got = nonfinite_samples(aux, final)
    assert got.tolist() == want.tolist() == [False, True, True, True, True, False]
