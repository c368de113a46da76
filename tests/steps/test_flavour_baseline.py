"""04's flavour-swapped baseline (issue 35 item 2): an EAGLE-3.1 drafter's exported folder copied
as the other flavour (fc_norm <-> norm_before_fc) loads back as the swapped weights computed by
hand, each engine reads the swapped flags from it, the simulator's swapped drafter draws the same
chains, and 04's simulator runs list it only for a drafter with a flavour to swap."""

import json

import torch
from safetensors.torch import load_file

from eagle3nb.drafter.acceptance import draft_chain
from eagle3nb.boundaries.engine_read import read_as_engine
from eagle3nb.drafter.export import export_drafter, load_drafter
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter, swapped_drafter
from eagle3nb.drafter.vocab import build_draft_vocab
from eagle3nb.steps.evaluate.served import FLAVOUR, flavour_swapped_dir


def _drafter(model, **flags):
    torch.manual_seed(2)
    c = DrafterConfig.for_target(model.config, 256)
    for k, v in flags.items():
        setattr(c, k, v)
    d = Eagle3Drafter(c, model.get_input_embeddings().weight.detach())
    d.set_vocab(*build_draft_vocab(torch.arange(512).flip(0), 256))
    for name, p in d.named_parameters():
        if p.requires_grad:
            p.data.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.3)
    return d.eval()


@torch.no_grad()
def test_swapped_copy_is_the_other_flavour_with_the_same_scales(target, tmp_path):
    model, _, _ = target
    emb = model.get_input_embeddings().weight.detach()
    for flags, other in (({"fc_norm": True}, "eagle3.1-norm_before_fc"),
                         ({"norm_before_fc": True}, "eagle3.1-fc_norm")):  # fmt: skip
        d = _drafter(model, norm_output=True, **flags)
        src = export_drafter(d, tmp_path / "d", [1, 2, 4], 5, {}, 1, 2)
        dst = tmp_path / "swapped"
        assert flavour_swapped_dir(src, dst) == other
        cfg = json.loads((dst / "config.json").read_text())
        assert cfg["eagle3nb"]["flavour"] == other and cfg["norm_output"] is True
        assert cfg["eagle3nb"]["flavour_swapped_of"] != other
        for engine in ("sglang", "vllm"):  # each engine reads the swapped flags
            f = read_as_engine(cfg, engine, 5)["flags"]
            assert (f["fc_norm"], f["norm_before_fc"]) == (not d.config.fc_norm, d.config.fc_norm)
        sd, sd0 = (
            load_file(str(dst / "model.safetensors")),
            load_file(str(src / "model.safetensors")),
        )
        scales = [sd0[f"fc_norm.{i}.weight"] for i in range(3)] if d.config.fc_norm else [sd0["input_norm.weight"]]  # fmt: skip
        got = [sd["input_norm.weight"]] if d.config.fc_norm else [sd[f"fc_norm.{i}.weight"] for i in range(3)]  # fmt: skip
        assert torch.equal(torch.cat(got), torch.cat(scales))  # by hand: the same numbers
        assert sd.keys() - {"input_norm.weight", "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"} == sd0.keys() - {"input_norm.weight", "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}  # fmt: skip
        loaded, _ = load_drafter(dst, emb)
        tokens, aux = torch.randint(0, 512, (12,)), torch.randn(11, 192) * torch.tensor([0.2, 1, 9]).repeat_interleave(64)  # fmt: skip
        sim = swapped_drafter(d)
        assert draft_chain(loaded, tokens, aux, 4) == draft_chain(sim, tokens, aux, 4)
        trained = [d.step(tokens[None, 1:], aux[None], torch.arange(11)[None], [], torch.arange(11))[1]]  # fmt: skip
        swapped = sim.step(tokens[None, 1:], aux[None], torch.arange(11)[None], [], torch.arange(11))[1]  # fmt: skip
        assert not torch.allclose(trained[0], swapped, atol=1e-3)  # another function


def test_no_swapped_copy_without_a_flavour_to_swap(target, tmp_path):
    model, _, _ = target
    for flags in ({}, {"norm_output": True}, {"fc_norm": True, "norm_before_fc": True}):
        src = export_drafter(_drafter(model, **flags), tmp_path / "d", [1, 2, 4], 5, {}, 1, 2)
        assert flavour_swapped_dir(src, tmp_path / "s") is None
        assert not (tmp_path / "s").exists() and swapped_drafter(load_drafter(src)[0]) is None
    assert FLAVOUR == "trained, flavour swapped"
