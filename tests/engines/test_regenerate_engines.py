"""Greedy turn-by-turn regeneration of the project's chat conversations through real vLLM and
SGLang (each in its own venv, float32, CPU) gives the same token ids as HF transformers, turn by
turn; a difference is reported with its conversation, turn and first position. Skipped, with the
reason, where an engine venv is absent (`bash .ci/setup_engines.sh` creates them)."""

import pytest

from testkit import requires_engine, sglang_ctx
from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
from eagle3nb.engines.pool import open_engine
from eagle3nb.engines.sglang_helpers import start_sglang
from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.target import models
from eagle3nb.text.conversations import load_records
from eagle3nb.text.generation import generate_batch
from eagle3nb.text.regenerate import regenerate

TEMPLATE = (REPO_ROOT / "eagle3nb/data/chat_template_stories.jinja").read_text()
N_CONV, MAX_NEW, BATCH = 8, 16, 4


@pytest.fixture(scope="module")
def records():
    recs = load_records(REPO_ROOT / "eagle3nb/data/chat_stories.openai.jsonl")[1]
    return [{k: v for k, v in r.items() if k != "where"} for r in recs[:N_CONV]]


def _regen(records, gen, tok, partial):
    return regenerate(
        records, gen, tok, TEMPLATE, template_kwargs={}, max_new_tokens=MAX_NEW, ctx=512,
        batch_size=BATCH, partial=partial, key="k",
    )  # fmt: skip


@pytest.fixture(scope="module")
def hf_results(records, target, tmp_path_factory):
    model, tok, _ = target
    eos = models.stop_token_ids(model, tok)

    def gen(batch, seed):
        return generate_batch(model, batch, MAX_NEW, eos, 0.0, 1.0, seed)

    return _regen(records, gen, tok, tmp_path_factory.mktemp("hf") / "p.jsonl")


def _first_difference(hf, other) -> str | None:
    """``None`` when every turn's output ids agree, else where they first differ."""
    for a, b in zip(hf, other):
        for t, (x, y) in enumerate(zip(a["turns"], b["turns"])):
            if x["prompt_ids"] != y["prompt_ids"] or x["output_ids"] != y["output_ids"]:
                xs, ys = x["output_ids"], y["output_ids"]
                pos = next(
                    (i for i, (u, v) in enumerate(zip(xs, ys)) if u != v), min(len(xs), len(ys))
                )
                return f"conversation {a['id']} turn {t}: first output difference at position {pos}"
        if len(a["turns"]) != len(b["turns"]):
            return f"conversation {a['id']}: {len(a['turns'])} turns vs {len(b['turns'])}"
    return None


def _engine_results(client, records, target, partial):
    model, tok, _ = target
    eos = models.stop_token_ids(model, tok)

    def gen(batch, seed):
        return client.generate(batch, MAX_NEW, eos, 0.0, 1.0, seed)

    return _regen(records, gen, tok, partial)


@requires_engine("vllm")
def test_vllm_regeneration_equals_hf(records, target, hf_results, tmp_path):
    path = models.resolve_model("stories260K-hd32")
    with open_engine(
        "vllm", path, "float32", python=DEFAULT_ENGINE_PYTHONS["vllm"], param="vllm_python",
        workdir_parent=tmp_path,
    ) as client:  # fmt: skip
        got = _engine_results(client, records, target, tmp_path / "p.jsonl")
    assert sum(len(r["turns"]) for r in got) > N_CONV  # multi-turn prompts were asked
    assert _first_difference(hf_results, got) is None, _first_difference(hf_results, got)
    assert [r["rows"] for r in got] == [r["rows"] for r in hf_results]


@requires_engine("sglang")
def test_sglang_regeneration_equals_hf(records, target, hf_results, tmp_path):
    path = models.resolve_model("stories260K-hd32")
    with start_sglang(path, "float32", "cpu", 0, None, tmp_path, sglang_ctx(path)) as client:
        got = _engine_results(client, records, target, tmp_path / "p.jsonl")
    assert _first_difference(hf_results, got) is None, _first_difference(hf_results, got)
    assert [r["rows"] for r in got] == [r["rows"] for r in hf_results]


@requires_engine("sglang")
def test_01_through_sglang_writes_the_hf_file(tmp_path):
    """01 (generate_step) on 6 conversations with generate_engine sglang and hf: the same
    generated.jsonl; SGLang's tokens/s recorded under metrics.json engines.sglang."""
    import json

    from eagle3nb.params import RunParams
    from eagle3nb.steps.generate.step import generate_step

    src = (REPO_ROOT / "eagle3nb/data/chat_stories.openai.jsonl").read_text().splitlines()
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(src[:6]) + "\n")
    files = {}
    for engine in ("hf", "sglang"):
        p = RunParams(
            outputs_dir=str(tmp_path), run_name=engine, mode="chat", dataset=str(data),
            chat_template=str(REPO_ROOT / "eagle3nb/data/chat_template_stories.jinja"),
            max_new_tokens=MAX_NEW, gen_batch_size=BATCH, heldout_fraction=0.35,
            generate_engine=engine,
        )  # fmt: skip
        out = generate_step(p, progress=False)
        files[engine] = (tmp_path / engine / "data/generated.jsonl").read_bytes()
    assert out["stats"]["engine"] == "sglang" and files["sglang"] == files["hf"]
    metrics = json.loads((tmp_path / "sglang/metrics.json").read_text())
    assert metrics["engines"]["sglang"]["regenerate_tokens_per_s_01"] > 0
