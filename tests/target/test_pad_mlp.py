"""The MLP-padded copy computes the original's function: HF logits and every hidden state of the
copy equal the original's on the default target (HF transformers' own forward, no hooks), its
widths are the padded ones, and what cannot be padded is refused."""

import json

import pytest
import torch
from safetensors.torch import save_file

from eagle3nb.target import models
from eagle3nb.target.pad_mlp import padded_width, write_padded_copy


def test_padded_width():
    assert padded_width(172) == 176 and padded_width(176) == 176 and padded_width(1, 16) == 16
    with pytest.raises(ValueError):
        padded_width(0)


def test_padded_copy_is_the_same_function(tmp_path):
    src = models.resolve_model("stories260K-hd32")
    dst = write_padded_copy(src, tmp_path / "mlp176")
    a, _, _ = models.load_target(str(src), "float32")
    b, _, _ = models.load_target(str(dst), "float32")
    assert a.config.intermediate_size == 172 and b.config.intermediate_size == 176
    assert b.model.layers[0].mlp.gate_proj.weight.shape[0] == 176
    info = json.loads((dst / "padded_mlp.json").read_text())
    assert info["intermediate_size"] == 172 and info["padded_intermediate_size"] == 176
    ids = torch.tensor([[1] + list(range(20, 120)), [1] + list(range(300, 400))])
    with torch.no_grad():
        oa = a(ids, output_hidden_states=True)
        ob = b(ids, output_hidden_states=True)
    for ha, hb in zip(oa.hidden_states, ob.hidden_states):
        assert torch.allclose(ha, hb, rtol=0, atol=1e-5)
    assert torch.allclose(oa.logits, ob.logits, rtol=0, atol=1e-4)
    assert (oa.logits.argmax(-1) == ob.logits.argmax(-1)).all()
    assert write_padded_copy(src, dst) == dst  # kept, not rewritten


def test_refusals(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json and model.safetensors"):
        write_padded_copy(tmp_path, tmp_path / "x")
    (tmp_path / "config.json").write_text(json.dumps({"intermediate_size": 176}))
    save_file({"w": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="already a multiple of 8"):
        write_padded_copy(tmp_path, tmp_path / "x")
    (tmp_path / "config.json").write_text(json.dumps({"intermediate_size": 172}))
    with pytest.raises(ValueError, match="not a Llama-family MLP"):
        write_padded_copy(tmp_path, tmp_path / "x")
