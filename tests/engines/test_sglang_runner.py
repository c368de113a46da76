"""Real SGLang 0.5.23 on CPU through its in-process ``ModelRunner`` (``capture_route: runner``, the
route of SGLang versions without the aux API, :mod:`eagle3nb.engines.sglang_runner`), in its own
venv behind the worker: the captured rows are HF's ``hidden_states[id + 1]`` (float32, HF's own
``output_hidden_states``, no hooks of ours), every token has a row, the log-probabilities and the
plain prefill's greedy token are HF's,
bfloat16 restarts the runner in the same worker, and ``capture_model`` (the twin proof's call)
captures another folder through the same route. Skipped where the SGLang venv is absent.
"""

import pytest
import torch

from testkit import requires_engine
from eagle3nb.target import models

pytestmark = requires_engine("sglang")

IDS = [0, 1, 3]  # SGLang ids -> boundaries 1, 2, 4 of the 5-layer target
SAMPLES = [[1, 20, 30, 40, 50, 60, 70], [1, 7, 8], [1] + list(range(100, 160))]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from eagle3nb.engines.sglang_helpers import start_sglang

    path = models.resolve_model("stories260K-hd32")
    opts = {"capture_route": "runner", "max_total_tokens": 512}
    client = start_sglang(path, "float32", "cpu", 0, None, tmp_path_factory.mktemp("r"), 512, opts)
    yield client, path
    client.close()


@pytest.fixture(scope="module")
def hf():
    return models.load_target("stories260K-hd32", "float32")[0]


def _hf(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    lp = torch.log_softmax(out.logits[0].float(), -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])
    return out.hidden_states, lp[:, 0]


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_runner_route_equals_hf_at_id_plus_1_float32(runner, hf):
    client, _ = runner
    res = client.capture(SAMPLES, IDS, logprobs=True)
    info = client.info()
    assert info["capture_route"] == "runner" and info["engine_version"] == "0.5.23"
    H = hf.config.hidden_size
    for s, r in zip(SAMPLES, res):
        hs, lp = _hf(hf, s)
        assert r["aux"].shape == (len(s), len(IDS) * H) and "final" not in r
        for j, i in enumerate(IDS):
            got = r["aux"][:, j * H : (j + 1) * H]
            assert _rel(got, hs[i + 1][0]) < 1e-5  # measured ~2e-7
            assert _rel(got, hs[i + 2][0]) > 0.1  # the next boundary is far: the id is named
        assert torch.isnan(r["input_logprobs"][0])
        assert (r["input_logprobs"][1:] - lp).abs().max() < 1e-4
    # 02b's speed pass on the runner: one greedy token per sample from its plain prefill, no engine
    nxt = client.generate(SAMPLES, 1, [], 0.0, 1.0, 0, on_capture_engine=True)
    with torch.no_grad():
        want = [[int(hf(torch.tensor([s])).logits[0, -1].argmax())] for s in SAMPLES]
    assert nxt == want and client.info(live=True)["mode"][0] == "runner"


def test_runner_route_bfloat16_and_another_folder(runner, hf):
    client, path = runner
    H = hf.config.hidden_size
    res = client.capture(SAMPLES[:2], IDS, dtype="bfloat16")  # the runner rebuilt in bf16
    for s, r in zip(SAMPLES[:2], res):
        hs, _ = _hf(hf, s)
        for j, i in enumerate(IDS):
            err = _rel(r["aux"][:, j * H : (j + 1) * H], hs[i + 1][0])
            assert 1e-4 < err < 0.03  # bf16 rounding (measured ~0.007), not float32's 1e-7
    other = client.capture_model(str(path), SAMPLES[:1], [2])  # the twin proof's call
    hs, _ = _hf(hf, SAMPLES[0])
    assert _rel(other[0]["aux"], hs[3][0]) < 1e-5
