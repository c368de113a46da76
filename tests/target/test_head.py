"""eagle3nb.target.head: offline training holds the target's head only (embed_tokens, final norm,
lm_head read by name from safetensors), so its memory does not grow with the target's depth, and
it trains exactly the weights the whole model trains.

Tiny random Llama targets with 2 and 40 layers are built from configs here (the 40-layer one
given the 2-layer one's embedding, norm and head), saved, and read back head-only."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from eagle3nb.target.head import head_tensor_names, load_target_head
from eagle3nb.training.loop import TrainConfig, train_drafter

H, V = 64, 256


def _llama(layers: int, tied: bool = False) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        hidden_size=H,
        intermediate_size=96,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=V,
        num_hidden_layers=layers,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    small, deep = _llama(2), _llama(40)
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        deep.get_parameter(name).copy_(small.get_parameter(name) + (name == "model.norm.weight"))
    small.model.norm.weight.add_(1.0)  # a norm weight that is not all ones: it must be read
    out = {}
    for m, name in ((small, "t2"), (deep, "t40")):
        d = tmp_path_factory.mktemp(name)
        m.save_pretrained(d)
        out[name] = (m, d)
    return out


class RandomSource:
    """A BatchSource of random aux/final states (6 samples of 24 tokens, batches of 2)."""

    n_aux = 3

    def __init__(self):
        g = torch.Generator().manual_seed(5)
        self.ids = torch.randint(0, V, (6, 24), generator=g)
        self.aux = torch.randn(6, 24, 3 * H, generator=g)
        self.final = torch.randn(6, 24, H, generator=g) * 3

    def fingerprint(self):
        return "random-5"

    def token_masks(self):
        return [(x, torch.ones_like(x)) for x in self.ids]

    def batches(self, start, stop, rank=0, world=1, pin_memory=False):
        for s in range(start, stop):
            i = [(2 * s) % 6, (2 * s + 1) % 6]
            yield {
                "input_ids": self.ids[i],
                "aux": self.aux[i],
                "final": self.final[i],
                "loss_mask": torch.ones(2, 24, dtype=torch.long),
                "attn_mask": torch.ones(2, 24, dtype=torch.long),
                "sample_index": torch.tensor(i),
            }


def _train(target, out):
    cfg = TrainConfig(draft_vocab_size=128, batch_size=2, max_steps=4, warmup_steps=1, ttt_steps=3)
    d, rep = train_drafter(RandomSource(), target, cfg, out, tracking=())
    return d.state_dict(), [h["loss"] for h in rep["history"]]


def test_head_only_memory_is_independent_of_depth_and_trains_the_same_weights(targets, tmp_path):
    (m2, d2), (m40, d40) = targets["t2"], targets["t40"]
    h2, h40 = load_target_head(d2), load_target_head(d40)
    head_bytes = (2 * V * H + H) * 4  # embedding, lm_head, norm in float32
    assert h2.nbytes() == h40.nbytes() == head_bytes
    full40 = sum(p.numel() * p.element_size() for p in m40.parameters())
    assert full40 > 20 * head_bytes  # what the whole-model path held
    assert h40.config.num_hidden_layers == 40 and not h2.tied
    for a, b in ((h2, m2), (h40, m40)):
        assert torch.equal(a.model.norm.weight, b.model.norm.weight)
        assert torch.equal(a.lm_head.weight, b.lm_head.weight)
        x = torch.randn(3, H)
        assert torch.equal(a.lm_head(a.model.norm(x)), b.lm_head(b.model.norm(x)))
    sd_full, loss_full = _train(m2, tmp_path / "full")
    sd_h2, loss_h2 = _train(h2, tmp_path / "h2")
    sd_h40, loss_h40 = _train(h40, tmp_path / "h40")
    assert loss_full == loss_h2 == loss_h40
    for k, v in sd_full.items():
        assert torch.equal(v, sd_h2[k]) and torch.equal(v, sd_h40[k]), k


def test_tied_embeddings_and_wrapper_names_in_a_sharded_index(tmp_path):
    m = _llama(2, tied=True)
    m.save_pretrained(tmp_path / "tied")
    h = load_target_head(tmp_path / "tied")
    assert h.tied and h.lm_head.weight.data_ptr() == h.model.embed_tokens.weight.data_ptr()
    assert h.nbytes() == (V * H + H) * 4
    assert torch.equal(h.lm_head.weight, m.model.embed_tokens.weight)
    # a multimodal wrapper's names, over two shards with an index; vision tensors are not read
    src = load_file(str(tmp_path / "tied" / "model.safetensors"))
    w = tmp_path / "mm"
    w.mkdir()
    (w / "config.json").write_text((tmp_path / "tied" / "config.json").read_text())
    cfg = json.loads((w / "config.json").read_text()) | {"tie_word_embeddings": False}
    (w / "config.json").write_text(json.dumps(cfg))
    lm = m.model.embed_tokens.weight.flip(0).contiguous()
    a = {"model.language_model.embed_tokens.weight": src["model.embed_tokens.weight"]}
    a["model.visual.norm.weight"] = torch.zeros(H)
    b = {"model.language_model.norm.weight": src["model.norm.weight"] + 2, "lm_head.weight": lm}
    b["model.language_model.layers.0.embed_tokens.weight"] = torch.zeros(V, H)  # MTP-like
    save_file(a, str(w / "a.safetensors"))
    save_file(b, str(w / "b.safetensors"))
    wm = {k: "a.safetensors" for k in a} | {k: "b.safetensors" for k in b}
    (w / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    h = load_target_head(w, torch.bfloat16)
    assert not h.tied and h.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(h.lm_head.weight, lm.bfloat16())
    assert torch.equal(h.model.norm.weight, (src["model.norm.weight"] + 2).bfloat16())
    names = head_tensor_names(wm, tied=False)
    assert names["embed"] == "model.language_model.embed_tokens.weight"
    with pytest.raises(KeyError, match="no single"):
        head_tensor_names(["a.embed_tokens.weight", "b.embed_tokens.weight"], False)


def test_head_only_target_knows_its_layer_count(targets):
    """03 resolves the boundaries from N with a head-only target (no layers loaded): N is the
    config's, the one the full model's decoder has (2 and 40 layers here)."""
    from eagle3nb.target.capture import n_layers_of

    (m2, d2), (m40, d40) = targets["t2"], targets["t40"]
    assert n_layers_of(load_target_head(d2)) == n_layers_of(m2) == 2
    assert n_layers_of(load_target_head(d40)) == n_layers_of(m40) == 40
