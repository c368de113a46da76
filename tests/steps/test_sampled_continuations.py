"""01's ``sampled_continuations``: per train prompt, the greedy record plus n sampled ones, each a
real continuation of the same prompt ids (checked here against the target's own greedy decoding
and token-by-token likelihood, not against the code under test), and refused with a dataset."""

import pytest
import torch

from eagle3nb import params
from eagle3nb.rundir import RunDir
from eagle3nb.steps.generate.step import generate_step
from eagle3nb.target import models
from eagle3nb.text.generation import read_jsonl


def test_greedy_record_plus_sampled_ones_per_train_prompt(tmp_path):
    p = params.RunParams(outputs_dir=str(tmp_path), run_name="samp", max_train_prompts=4,
        max_new_tokens=12, sampled_continuations=2, sample_temperature=1.0, interactive=False)  # fmt: skip
    out = generate_step(p, progress=False)
    recs = read_jsonl(RunDir(p).generated)
    train = [r for r in recs if r["split"] == "train"]
    assert len(train) == 4 * 3 and len({r["id"] for r in recs}) == len(recs)
    base = [r for r in train if "variant" not in r]
    assert len(base) == 4
    model, tok, _ = models.load_target(p.model, "float32", "cpu")
    sampled_differs = 0
    for b in base:
        ids = torch.tensor([b["prompt_ids"]])
        with torch.no_grad():  # the target's own greedy continuation, one prompt at a time
            g = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :].tolist()
        eos = models.stop_token_ids(model, tok)
        assert b["output_ids"] == g[: len(b["output_ids"])] and (
            len(b["output_ids"]) == 12 or g[len(b["output_ids"]) - 1] in eos
        )
        vs = [r for r in train if r.get("variant") and r["prompt_ids"] == b["prompt_ids"]]
        assert sorted(r["variant"] for r in vs) == [1, 2]
        for r in vs:
            assert 1 <= len(r["output_ids"]) <= 12
            # every sampled token has non-zero probability under the target (a real sample)
            seq = torch.tensor([b["prompt_ids"] + r["output_ids"]])
            with torch.no_grad():
                logp = model(seq).logits[0].log_softmax(-1)
            n = len(b["prompt_ids"])
            lp = logp[n - 1 : -1].gather(-1, seq[0, n:, None]).squeeze(-1)
            assert torch.isfinite(lp).all()
            sampled_differs += r["output_ids"] != b["output_ids"]
    assert (
        sampled_differs >= 4
    )  # temperature 1.0 over 12 tokens: most samples leave the greedy path
    assert out["manifest"]["decoding"]["sampled_continuations"] == 2
    assert out["stats"]["generated_tokens"] == sum(len(r["output_ids"]) for r in train)


def test_sampled_continuations_refused_with_a_dataset():
    with pytest.raises(ValueError, match="sampled_continuations=1"):
        params.RunParams(dataset="eagle3nb/data/chat_stories.openai.jsonl", sampled_continuations=1,
            interactive=False)  # fmt: skip


def test_sampled_prefix_then_greedy(tmp_path):
    """``sampled_prefix_tokens``: each extra record is N sampled tokens, then the target's own
    greedy continuation of prompt + those N tokens (checked with HF ``generate`` one prompt at a
    time), max_new_tokens in all unless an EOS ends it."""
    n, total = 3, 10
    p = params.RunParams(outputs_dir=str(tmp_path), run_name="pre", max_train_prompts=4,
        max_new_tokens=total, sampled_continuations=2, sample_temperature=1.5,
        sampled_prefix_tokens=n, interactive=False)  # fmt: skip
    out = generate_step(p, progress=False)
    train = [r for r in read_jsonl(RunDir(p).generated) if r["split"] == "train"]
    model, tok, _ = models.load_target(p.model, "float32", "cpu")
    eos = models.stop_token_ids(model, tok)
    extra = [r for r in train if r.get("variant")]
    assert len(extra) == 8
    left_greedy = 0
    for r in extra:
        o = r["output_ids"]
        if any(t in eos for t in o[:n]):  # an EOS inside the sampled prefix ends the record
            assert o[-1] in eos and len(o) <= n
            continue
        ids = torch.tensor([r["prompt_ids"] + o[:n]])
        with torch.no_grad():
            g = model.generate(ids, max_new_tokens=total - n, do_sample=False)[0, ids.shape[1] :]
        g = g.tolist()
        assert o[n:] == g[: len(o) - n] and (len(o) == total or o[-1] in eos)
        with torch.no_grad():  # the prefix alone is not what greedy decoding gives
            g0 = model.generate(torch.tensor([r["prompt_ids"]]), max_new_tokens=n, do_sample=False)
        left_greedy += o[:n] != g0[0, -n:].tolist()
    assert left_greedy >= 2  # temperature 1.5 over 3 tokens: some prefixes leave the greedy path
    assert out["manifest"]["decoding"]["sampled_prefix_tokens"] == n


def test_sampled_prefix_without_continuations_refused():
    with pytest.raises(ValueError, match="sampled_prefix_tokens=8 .*sampled_continuations >= 1"):
        params.RunParams(sampled_prefix_tokens=8, interactive=False)
