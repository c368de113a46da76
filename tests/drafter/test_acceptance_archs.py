"""The acceptance simulator on MoE, MLA and multimodal-wrapper targets (tiny random-weight models
built from configs): greedy chain speculative decoding emits exactly the target's own greedy
continuation (computed here by a plain argmax loop over the full model's logits), whatever the
drafter proposes; and the final norm found for wrappers and head-only targets is the decoder's."""

import sys
from pathlib import Path

import pytest
import torch

from eagle3nb.drafter.acceptance import speculative_generate
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.target.capture import decoder_of, final_norm_of

sys.path.insert(0, str(Path(__file__).parents[1] / "target"))
from tiny_archs import V, tiny_config, tiny_model  # noqa: E402

ARCHS = [
    "Qwen3MoeForCausalLM",
    "DeepseekV3ForCausalLM",
    "GptOssForCausalLM",
    "Gemma3ForConditionalGeneration",
    "Kimi_K25ForConditionalGeneration",
]


def _argmax_loop(model, prompt, n):
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt) :]


@pytest.mark.parametrize("arch", ARCHS)
def test_speculative_output_equals_greedy(arch):
    model = tiny_model(arch)
    torch.manual_seed(0)
    c = DrafterConfig.for_target(model.config.get_text_config(), 64)
    d = Eagle3Drafter(c, model.get_input_embeddings().weight.detach()).eval()
    prompt = torch.randint(0, V, (7,), generator=torch.Generator().manual_seed(4)).tolist()
    new, stats = speculative_generate(model, d, prompt, [0, 1, 2], k=2, max_new_tokens=8)
    assert new == _argmax_loop(model, prompt, 8)
    assert stats.emitted_tokens == 8


def test_final_norm_of_wrapper_and_head_only():
    from eagle3nb.target.head import TargetHead

    m = tiny_model("Gemma3ForConditionalGeneration")
    assert final_norm_of(m) is decoder_of(m).norm is m.model.language_model.norm
    cfg = tiny_config("LlamaForCausalLM")
    h = TargetHead(cfg, torch.randn(V, cfg.hidden_size), torch.ones(cfg.hidden_size), None)
    assert final_norm_of(h) is h.model.norm
