"""01's batched generation decodes with sdpa attention and hands the model back with its own
(eager); its tokens are those of HF's eager greedy decoding one prompt at a time, unpadded
(``greedy_generate``, the acceptance simulator's reference)."""

import pytest
import torch

from eagle3nb.drafter.acceptance import greedy_generate
from eagle3nb.text.generation import generate_batch, generation_attention
from target.tiny_archs import tiny_model

PROMPTS = [
    "Once upon a time, there was a little girl named Lily.",
    "Tom had a red ball.",
    "One day, a big dog saw a cat in the park and wanted to play with it, but the cat ran",
]


def _batch_in(model, ids, *args, **kw) -> tuple[list, list[str]]:
    """generate_batch's output and the attention the model ran ``generate`` with."""
    seen, orig = [], model.generate

    def gen(*a, **k):
        seen.append(model.config._attn_implementation)
        return orig(*a, **k)

    model.generate = gen
    try:
        return generate_batch(model, ids, *args, **kw), seen
    finally:
        del model.generate


def test_sdpa_batch_equals_eager_one_by_one(target):
    model, tok, _ = target
    assert model.config._attn_implementation == "eager"
    ids = [tok(p).input_ids for p in PROMPTS]  # ragged: left padding differs per row
    out, seen = _batch_in(model, ids, 60, [2])
    assert seen == ["sdpa"] and generation_attention(model) == "sdpa"
    assert model.config._attn_implementation == "eager"  # handed back as it came
    assert out == [greedy_generate(model, p, 60, [2]) for p in ids]


def test_sdpa_sampling_equals_eager_sampling(target):
    model, tok, _ = target
    ids = [tok(p).input_ids for p in PROMPTS]
    kw = dict(temperature=0.8, top_p=0.95, seed=3)
    out, seen = _batch_in(model, ids, 40, [2], **kw)
    assert seen == ["sdpa"] and out != generate_batch(model, ids, 40, [2])  # it did sample
    model._supports_sdpa = False  # the same call decoded with the model's own eager attention
    try:
        ref, seen = _batch_in(model, ids, 40, [2], **kw)
    finally:
        del model._supports_sdpa
    assert seen == ["eager"] and out == ref


@pytest.mark.parametrize(
    "arch", ["Qwen3MoeForCausalLM", "GptOssForCausalLM", "DeepseekV3ForCausalLM"]
)
def test_sdpa_on_moe_targets(arch):
    model = tiny_model(arch)
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (5, 11, 17)]
    out, seen = _batch_in(model, ids, 12, None)
    assert seen == [generation_attention(model)] and model.config._attn_implementation == "eager"
    assert out == [greedy_generate(model, p, 12, None) for p in ids]
