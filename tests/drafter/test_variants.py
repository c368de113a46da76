"""Drafter variants the engines read (``norm_before_fc`` with ``input_norm``, ``fc_norm`` with one
norm per aux state, EAGLE-3.1's ``norm_output``): the flagged drafter against a second computation by hand, export under the keys
both engines read and back, refusal of flags the drafter does not implement, training with a flag
on, and export of boundary N for vLLM with SGLang refused by name."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from testkit import engine_file_lines, requires_engine

from eagle3nb.drafter.acceptance import draft_chain
from eagle3nb.drafter.card import serve_commands_markdown
from eagle3nb.boundaries.engine_read import UNIMPLEMENTED_FLAGS, engine_report
from eagle3nb.drafter.export import export_drafter, load_drafter
from eagle3nb.boundaries.flavours import FLAG_READS, flag_refusals
from eagle3nb.boundaries.refusal import REFUSED_MARK
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter, flavour_of, swap_norm_flavour
from eagle3nb.drafter.vocab import build_draft_vocab
from eagle3nb.target.capture import final_norm_of
from eagle3nb.training.loop import TrainConfig, build_drafter, train_drafter
from eagle3nb.training.objective import ttt_loss

EPS = 1e-5  # the target's rms_norm_eps, which the drafter takes


def rms_by_hand(x, w):
    """RMSNorm written out: x / sqrt(mean(x^2) + eps) * w (float64, then back)."""
    x64 = x.double()
    return (x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + EPS) * w.double()).to(x.dtype)


def make(model, seed=1, dv=256, **flags):
    torch.manual_seed(seed)
    c = DrafterConfig.for_target(model.config, dv)
    for k, v in flags.items():
        setattr(c, k, v)
    d = Eagle3Drafter(c, model.get_input_embeddings().weight.detach())
    d.set_vocab(*build_draft_vocab(torch.arange(512).flip(0), dv))
    torch.manual_seed(seed)
    for name, p in d.named_parameters():
        if p.requires_grad:  # norms away from 1 too, so that a weight applied twice would show
            p.data.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.3)
    return d.eval()


def plain_twin(d):
    """The same weights in a drafter without the flags (its flag parts are then done by hand)."""
    off = {"norm_before_fc": False, "norm_output": False, "fc_norm": False}
    c = DrafterConfig(**{**d.config.to_dict(), **off})
    t = Eagle3Drafter(c, d.embed_tokens.weight.detach())
    sd = {k: v for k, v in d.state_dict().items() if not k.startswith(("input_norm", "fc_norm"))}
    t.load_state_dict(sd)
    return t.eval()


@torch.no_grad()
def test_norm_before_fc_is_one_rmsnorm_over_the_whole_concat(target):
    model, _, _ = target
    d = make(model, norm_before_fc=True)
    assert tuple(d.input_norm.weight.shape) == (3 * 64,)
    t = plain_twin(d)
    ids, aux = torch.randint(0, 512, (2, 7)), 3.0 * torch.randn(2, 7, 192)
    idx = torch.arange(7)
    got = d.step(ids, aux, idx[None].expand(2, 7), [], idx)
    by_hand = t.step(ids, rms_by_hand(aux, d.input_norm.weight), idx[None].expand(2, 7), [], idx)
    assert torch.allclose(got[1], by_hand[1], atol=1e-5) and torch.allclose(
        got[0], by_hand[0], atol=1e-4
    )
    per_chunk = torch.cat([rms_by_hand(a, torch.ones(64)) for a in aux.split(64, -1)], -1)
    other = t.step(ids, per_chunk * d.input_norm.weight, idx[None].expand(2, 7), [], idx)[1]
    assert not torch.allclose(got[1], other, atol=1e-3)  # not fc_norm's per-chunk norms
    # a later step (the hidden is the drafter's own, H wide) does not go through input_norm
    c1 = d.step(ids[:, -1:], got[0][:, -1:], idx[None, -1:] + 1, [got[2]], idx[-1:])
    c2 = t.step(ids[:, -1:], by_hand[0][:, -1:], idx[None, -1:] + 1, [by_hand[2]], idx[-1:])
    assert torch.allclose(c1[1], c2[1], atol=1e-5)


def pre_fc_by_hand(d, aux):
    """The aux states as the flagged drafter ``d`` feeds them to fc, written out: input_norm over
    the whole concat, then (fc_norm) each 64-wide aux state normed alone with its own weight."""
    a = rms_by_hand(aux, d.input_norm.weight) if d.config.norm_before_fc else aux
    if d.config.fc_norm:
        a = torch.cat([rms_by_hand(x, n.weight) for x, n in zip(a.split(64, -1), d.fc_norm)], -1)
    return a


@torch.no_grad()
@pytest.mark.parametrize("both", [False, True])
def test_fc_norm_is_one_rmsnorm_per_aux_state(target, both):
    """fc_norm: three [64] weights, each aux state's own RMS (not the concat's); with norm_before_fc
    too, input_norm first (vLLM llama_eagle3.py:405-416 and SGLang 239-246 apply them so)."""
    model, _, _ = target
    d = make(model, fc_norm=True, norm_before_fc=both)
    assert [tuple(n.weight.shape) for n in d.fc_norm] == [(64,)] * 3
    t = plain_twin(d)
    # aux states of very different scales: per-state and whole-concat RMS then differ
    ids, aux = torch.randint(0, 512, (2, 7)), torch.randn(2, 7, 192) * torch.tensor([0.1, 1, 30]).repeat_interleave(64)  # fmt: skip
    idx = torch.arange(7)
    got = d.step(ids, aux, idx[None].expand(2, 7), [], idx)
    by_hand = t.step(ids, pre_fc_by_hand(d, aux), idx[None].expand(2, 7), [], idx)
    assert torch.allclose(got[1], by_hand[1], atol=1e-5) and torch.allclose(
        got[0], by_hand[0], atol=1e-4
    )
    whole = rms_by_hand(aux, torch.cat([n.weight for n in d.fc_norm]))  # the other flavour
    assert not torch.allclose(
        got[1], t.step(ids, whole, idx[None].expand(2, 7), [], idx)[1], atol=1e-3
    )
    c1 = d.step(ids[:, -1:], got[0][:, -1:], idx[None, -1:] + 1, [got[2]], idx[-1:])
    c2 = t.step(ids[:, -1:], by_hand[0][:, -1:], idx[None, -1:] + 1, [by_hand[2]], idx[-1:])
    # a later step's hidden skips the norms; float32 rounding of two orders of the same sums reaches
    # 1.7e-5 on values near 10 on some CPUs (measured), as got[0] above: atol 1e-4
    assert torch.allclose(c1[1], c2[1], atol=1e-4)


@torch.no_grad()
def test_flavour_names_and_the_swapped_reading(target):
    model, _, _ = target
    d = make(model, fc_norm=True, norm_output=True)
    assert flavour_of(d.config) == "eagle3.1-fc_norm"
    assert flavour_of(make(model).config) == "eagle3"
    assert flavour_of(make(model, norm_before_fc=True).config) == "eagle3+norm_before_fc"
    sd, c = swap_norm_flavour(d.state_dict(), d.config)
    assert flavour_of(c) == "eagle3.1-norm_before_fc" and c.norm_output
    s = Eagle3Drafter(c, d.embed_tokens.weight.detach()).eval()
    s.load_state_dict(sd)  # strict: exactly the other flavour's weights
    assert torch.equal(s.input_norm.weight, torch.cat([n.weight for n in d.fc_norm]))
    aux, ids, idx = torch.randn(1, 5, 192), torch.randint(0, 512, (1, 5)), torch.arange(5)
    t = plain_twin(d)
    want = t.step(ids, rms_by_hand(aux, s.input_norm.weight), idx[None], [], idx)[1]
    assert torch.allclose(s.step(ids, aux, idx[None], [], idx)[1], want, atol=1e-5)
    back_sd, back_c = swap_norm_flavour(sd, c)  # and back: the same drafter
    assert back_c == d.config and all(torch.equal(back_sd[k], v) for k, v in d.state_dict().items())
    assert swap_norm_flavour(sd, make(model, norm_output=True).config) is None


def chain_by_hand(t, tokens, a, k, feed):
    """A greedy chain with the plain twin ``t``, ``feed(out)`` being the hidden fed to the next
    step. Returns (drafts, logits of each step's last position)."""
    n = a.shape[0]
    idx = torch.arange(n)
    out, logits, kv = t.step(tokens[None, 1:], a[None], idx[None], [], idx)
    cache, drafts, seen = [kv], [], [logits[0, -1]]
    for j in range(k - 1):
        drafts.append(int(t.draft_to_target(logits[0, -1].argmax())))
        hid = feed(out[:, -1:])
        out, logits, kv = t.step(
            torch.tensor([[drafts[-1]]]), hid, idx[None, -1:] + 1 + j, cache, idx[-1:]
        )
        cache.append(kv)
        seen.append(logits[0, -1])
    drafts.append(int(t.draft_to_target(logits[0, -1].argmax())))
    return drafts, seen


@torch.no_grad()
@pytest.mark.parametrize(
    "flags",
    [{"norm_output": True}, {"norm_output": True, "norm_before_fc": True},
     {"norm_output": True, "fc_norm": True}],
)  # fmt: skip
def test_simulator_chain_with_flags_equals_chain_by_hand(target, flags):
    """draft_chain of the flagged drafter == a chain written out with the plain twin, where the
    hidden fed to step j+1 is norm(out_j) by hand (EAGLE-3.1) and the aux are normed by hand."""
    model, _, _ = target
    d = make(model, seed=3, **flags)
    t = plain_twin(d)
    n, k = 9, 4
    tokens = torch.randint(0, 512, (n + 1,))
    aux = 2.0 * torch.randn(n, 192)
    a = pre_fc_by_hand(d, aux)
    drafts, seen = chain_by_hand(t, tokens, a, k, lambda o: rms_by_hand(o, t.norm.weight))
    assert draft_chain(d, tokens, aux, k) == drafts
    _, seen_pre = chain_by_hand(t, tokens, a, k, lambda o: o)  # EAGLE-3's pre-norm feed
    assert torch.allclose(seen[0], seen_pre[0])  # step 0 is the same function
    assert not torch.allclose(seen[1], seen_pre[1], atol=1e-3)  # the feed differs from step 1


def test_export_writes_flags_where_both_engines_read_them_and_loads_back(target, tmp_path):
    model, _, _ = target
    d = make(model, norm_before_fc=True, norm_output=True)
    out = export_drafter(d, tmp_path / "d", [1, 2, 4], 5, {}, 1, 2)
    cfg = json.loads((out / "config.json").read_text())
    # top-level keys: vLLM llama_eagle3.py:184-188, 252 and speculators/algos.py:36-38; SGLang
    # llama_eagle3.py:173-175, 207
    assert cfg["norm_before_fc"] is True and cfg["norm_output"] is True
    assert "norm_before_fc" not in cfg["eagle_config"] and cfg["num_aux_hidden_states"] == 3
    sd = load_file(str(out / "model.safetensors"))
    assert tuple(sd["input_norm.weight"].shape) == (192,)
    assert torch.equal(sd["input_norm.weight"], d.input_norm.weight.detach())
    d2, _ = load_drafter(out, model.get_input_embeddings().weight.detach())
    assert d2.config.norm_before_fc and d2.config.norm_output
    tokens, aux = torch.randint(0, 512, (10,)), torch.randn(9, 192)
    assert draft_chain(d2, tokens, aux, 5) == draft_chain(d, tokens, aux, 5)
    rep = engine_report(cfg, [1, 2, 4], 5, {"norm_before_fc": True, "norm_output": True})
    assert rep["sglang"]["ok"] and rep["vllm"]["ok"]


def _exported(model, tmp_path, **flags):
    return export_drafter(make(model, **flags), tmp_path / "d", [1, 2, 4], 5, {}, 1, 2)


@pytest.mark.parametrize(
    "key,value",
    [("use_aux_norm", True), ("attention_bias", True), ("logit_scale", 2.0),
     ("num_hidden_layers", 2), ("my_new_flag", True)],
)  # fmt: skip
def test_loader_refuses_flags_it_does_not_implement(target, tmp_path, key, value):
    model, _, _ = target
    out = _exported(model, tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    cfg[key] = value
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=rf"{out}/config\.json.*{key}"):
        load_drafter(out)
    if key in UNIMPLEMENTED_FLAGS:  # the value under which the flag changes nothing loads
        cfg[key] = UNIMPLEMENTED_FLAGS[key]
        (out / "config.json").write_text(json.dumps(cfg))
        load_drafter(out)


def test_loader_refuses_contradicting_or_incomplete_variant_files(target, tmp_path):
    model, _, _ = target
    out = _exported(model, tmp_path, norm_before_fc=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg["eagle_config"]["norm_before_fc"] = False  # engines' plain readers take the nested key
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="eagle_config.norm_before_fc"):
        load_drafter(out)
    cfg["eagle_config"]["unknown_nested"] = 1
    del cfg["eagle_config"]["norm_before_fc"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="eagle_config.unknown_nested"):
        load_drafter(out)
    del cfg["eagle_config"]["unknown_nested"]
    (out / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(out / "model.safetensors"))
    w = sd.pop("input_norm.weight")
    save_file(sd, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match=r"input_norm\.weight"):
        load_drafter(out)
    cfg["norm_before_fc"] = False  # weight present, flag off: neither engine would load it
    (out / "config.json").write_text(json.dumps(cfg))
    save_file({**sd, "input_norm.weight": w}, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match=r"input_norm\.weight: in the file but not a weight"):
        load_drafter(out)


@torch.no_grad()
def _loss(d, ds, model):
    tot = 0.0
    for x in ds:
        ids, m = x["input_ids"][None].long(), x["loss_mask"][None]
        r = ttt_loss(d, ids, x["aux"][None].float(), x["final"][None].float(), m,
                     torch.ones_like(m), final_norm_of(model), model.get_output_embeddings(), k=3)  # fmt: skip
        tot += float(r.loss)
    return tot


def test_fc_norm_exports_under_the_engines_names_and_loads_back(target, tmp_path):
    """fc_norm.{i}.weight and top-level fc_norm (vLLM llama_eagle3.py:231, speculators algos.py:37;
    SGLang 185), every flavour flag written true or false, the flavour named; SGLang's legacy
    names and use_aux_norm (with fc_norm) read back; fc_norm weights without the flag refused."""
    model, _, _ = target
    d = make(model, fc_norm=True, norm_output=True)
    out = export_drafter(d, tmp_path / "d", [1, 2, 4], 5, {}, 1, 2)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["fc_norm"], cfg["norm_before_fc"], cfg["norm_output"]) == (True, False, True)
    assert (
        cfg["eagle3nb"]["flavour"] == "eagle3.1-fc_norm"
        and "refused_engines" not in cfg["eagle3nb"]
    )
    sd = load_file(str(out / "model.safetensors"))
    assert [k for k in sd if "norm" in k and "midlayer" not in k] == ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight", "norm.weight"]  # fmt: skip
    emb = model.get_input_embeddings().weight.detach()
    tokens, aux = torch.randint(0, 512, (10,)), 5 * torch.randn(9, 192)
    want = draft_chain(d, tokens, aux, 5)
    assert draft_chain(load_drafter(out, emb)[0], tokens, aux, 5) == want
    legacy = {("aux_norm_low", "aux_norm_mid", "aux_norm_high")[int(k.split(".")[1])] + ".weight" if k.startswith("fc_norm") else k: v for k, v in sd.items()}  # fmt: skip
    save_file(legacy, str(out / "model.safetensors"))
    cfg["use_aux_norm"] = True
    (out / "config.json").write_text(json.dumps(cfg))
    assert draft_chain(load_drafter(out, emb)[0], tokens, aux, 5) == want
    cfg["fc_norm"] = False  # SGLang would apply fc_norm, vLLM would not
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="use_aux_norm=True without fc_norm"):
        load_drafter(out)
    del cfg["use_aux_norm"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"fc_norm\.0\.weight: in the file but not a weight"):
        load_drafter(out)
    save_file(
        {k: v for k, v in sd.items() if k != "fc_norm.1.weight"}, str(out / "model.safetensors")
    )
    cfg["fc_norm"] = True
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"lacks required tensors \['fc_norm\.1\.weight'\]"):
        load_drafter(out)


def test_an_engine_version_without_the_flag_is_refused_by_name(target, tmp_path, monkeypatch):
    """Every version read here reads all three flags (FLAG_READS); a version that lacks one, or
    that the table does not hold, is refused by name (no ids for it), the export goes on for the
    other engine, and fails only when none is left."""
    for row in FLAG_READS.values():
        assert set(row) == {"norm_before_fc", "fc_norm", "norm_output"}
    assert flag_refusals({"fc_norm": True}, {"vllm": "0.32.0+cpu", "sglang": "0.5.23"}) == {}
    why = flag_refusals({"fc_norm": True}, {"vllm": "0.20.0"})["vllm"]
    assert "vllm 0.20.0" in why and "fc_norm" in why and "FLAG_READS" in why
    assert flag_refusals({}, {"vllm": "0.20.0"}) == {}  # a plain drafter needs no flag
    model, _, _ = target
    row = {k: v for k, v in FLAG_READS[("sglang", "0.5.23")].items() if k != "fc_norm"}
    monkeypatch.setitem(FLAG_READS, ("sglang", "0.5.23"), row)  # a SGLang without fc_norm
    out = _exported(model, tmp_path, fc_norm=True)
    cfg = json.loads((out / "config.json").read_text())
    why = cfg["eagle3nb"]["refused_engines"]["sglang"]
    assert why.startswith("sglang 0.5.23 refused") and "does not read ['fc_norm']" in why
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, f"{REFUSED_MARK}: {why}"]
    assert "sglang" not in cfg["eagle3nb"].get("retrain", {})  # other boundaries would not help
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]  # vLLM still served
    monkeypatch.delitem(FLAG_READS, ("vllm", "0.32.0"))
    with pytest.raises(ValueError, match=r"no engine can capture them or serve.*vllm 0\.32\.0"):
        export_drafter(make(model, fc_norm=True), tmp_path / "e", [1, 2, 4], 5, {}, 1, 2)
    export_drafter(make(model), tmp_path / "e", [1, 2, 4], 5, {}, 1, 2)  # plain: no flag needed


@pytest.mark.parametrize("flag", ["norm_before_fc", "norm_output", "fc_norm"])
def test_short_training_with_the_flag_lowers_the_loss(target, tiny_ds, tmp_path, flag):
    model, _, _ = target
    cfg = TrainConfig(batch_size=2, max_steps=15, warmup_steps=2, ttt_steps=3, draft_vocab_size=128,
                      draft_num_heads=0, draft_num_kv_heads=0, log_every=1, eval_every=0, **{flag: True})  # fmt: skip
    trained, _ = train_drafter(tiny_ds, model, cfg, tmp_path / "t")
    untrained, _ = build_drafter(tiny_ds, model, cfg)  # the same seed, no step taken
    assert getattr(trained.config, flag) and getattr(untrained.config, flag)
    before, after = _loss(untrained, tiny_ds, model), _loss(trained, tiny_ds, model)
    print(flag, "TTT loss untrained", round(before, 3), "trained", round(after, 3))
    assert after < 0.8 * before, (before, after)
    if flag == "norm_before_fc":  # its weight is trained, not left at ones
        assert not torch.allclose(trained.input_norm.weight, untrained.input_norm.weight)
    if flag == "fc_norm":
        assert not torch.allclose(trained.fc_norm[2].weight, untrained.fc_norm[2].weight)


def test_boundary_n_exports_for_vllm_with_sglang_refused_by_name(target, tmp_path):
    """Llama: SGLang 0.5.23 captures boundaries 1..N-1 (the final norm captures nothing,
    engine_rules), vLLM 0.32.0 0..N. The export keeps vLLM, names SGLang refused, and the SGLang
    ids key holds the refusal mark (SGLang stops on it at start instead of serving its default
    ids, tests/drafter/test_export_refusal.py)."""
    model, _, _ = target
    man = {"target": {"architecture": "LlamaForCausalLM"}}
    out = export_drafter(make(model), tmp_path / "d", [1, 2, 5], 5, man, 1, 2)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 5]
    why = cfg["eagle3nb"]["refused_engines"]["sglang"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, f"{REFUSED_MARK}: {why}"]
    assert why.startswith("sglang 0.5.23 refused") and "LlamaForCausalLM" in why and "1..4" in why
    assert set(cfg["eagle3nb"]["refused_engines"]) == {"sglang"}
    rep = engine_report(cfg, [1, 2, 5], 5, {})
    assert rep["vllm"]["ok"] and rep["vllm"]["boundaries"] == [1, 2, 5]
    assert not rep["sglang"]["ok"] and rep["sglang"]["refused"] == why
    load_drafter(out)  # the vLLM-side file loads
    md = serve_commands_markdown("r", cfg, "T", str(out), 3)  # what 04 writes for the user
    assert f"SGLang: NOT servable ({why})" in md and "vLLM ids [1, 2, 5]" in md


def test_boundary_n_for_a_class_whose_sglang_rule_captures_it(target, tmp_path):
    """gpt-oss in SGLang 0.5.23 (rule unless_n, gpt_oss.py:1337-1352, 722-739) captures N: both
    engines get ids, each read back by its own rule as the trained boundaries."""
    from eagle3nb.boundaries.rules import engine_rule

    model, _, _ = target
    man = {"target": {"architecture": "GptOssForCausalLM"}}
    out = export_drafter(make(model), tmp_path / "d", [1, 2, 5], 5, man, 1, 2)
    cfg = json.loads((out / "config.json").read_text())
    assert "refused_engines" not in cfg["eagle3nb"]
    sg = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert engine_rule("sglang", "0.5.23", "GptOssForCausalLM").ids_to_boundaries(sg, 5) == [
        1,
        2,
        5,
    ]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 5]


def test_export_fails_only_when_no_engine_can_name_the_boundaries(target, tmp_path):
    model, _, _ = target
    # DeepSeek, boundaries [0, 2, 5] of 5 layers: SGLang's ids must lie below N, vLLM's id 0 raises
    man = {"target": {"architecture": "DeepseekV3ForCausalLM"}}
    with pytest.raises(ValueError, match=r"no engine can capture.*sglang 0\.5\.23.*vllm 0\.32\.0"):
        export_drafter(make(model), tmp_path / "d", [0, 2, 5], 5, man, 1, 2)
    assert not (tmp_path / "d").exists() and not list(tmp_path.iterdir())
    # a class both engines refuse (Gemma-3) still exports, each engine refused by name
    man = {"target": {"architecture": "Gemma3ForCausalLM"}}
    export_drafter(make(model), tmp_path / "g", [1, 2, 4], 5, man, 1, 2)
    cfg = json.loads((tmp_path / "g" / "config.json").read_text())
    assert set(cfg["eagle3nb"]["refused_engines"]) == {"sglang", "vllm"}


ENGINE_LINES = [
        ("vllm", "vllm/model_executor/models/llama_eagle3.py", 186,
         '"norm_before_fc", getattr(self.config, "norm_before_fc", False)'),
        ("vllm", "vllm/model_executor/models/llama_eagle3.py", 224, "self.input_norm: RMSNorm"),
        ("vllm", "vllm/model_executor/models/llama_eagle3.py", 226, "eps=self.config.rms_norm_eps"),
        ("vllm", "vllm/model_executor/models/llama_eagle3.py", 252,
         'self.norm_output = getattr(self.config, "norm_output", False)'),
        ("vllm", "vllm/model_executor/models/llama_eagle3.py", 286,
         "aux_output = hidden_states if self.norm_output else hidden_prenorm"),
        ("vllm", "vllm/model_executor/models/llama_eagle3.py", 407,
         "hidden_states = self.model.input_norm(hidden_states)"),
        ("vllm", "vllm/transformers_utils/configs/speculators/algos.py", 36,
         'pre_trained_config["norm_before_fc"] = config_dict.get("norm_before_fc", False)'),
        ("vllm", "vllm/transformers_utils/configs/speculators/algos.py", 38,
         'pre_trained_config["norm_output"] = config_dict.get("norm_output", False)'),
        ("sglang", "sglang/srt/models/llama_eagle3.py", 174,
         'eagle_config.get("norm_before_fc", getattr(config, "norm_before_fc", False))'),
        ("sglang", "sglang/srt/models/llama_eagle3.py", 177, "self.input_norm = RMSNorm("),
        ("sglang", "sglang/srt/models/llama_eagle3.py", 207,
         'self.norm_output = getattr(config, "norm_output", False)'),
        ("sglang", "sglang/srt/models/llama_eagle3.py", 240,
         "hidden_states = self.input_norm(hidden_states)"),
        ("sglang", "sglang/srt/models/llama_eagle3.py", 268,
         "aux = hidden_states_to_logits if self.norm_output else hidden_states_to_aux"),
        ("vllm", "vllm/model_executor/models/llama_eagle3.py", 231,
         'use_fc_norm = getattr(self.config, "fc_norm", False)'),
        ("vllm", "vllm/model_executor/models/llama_eagle3.py", 235,
         "RMSNorm(target_hidden_size, eps=self.config.rms_norm_eps)"),
        ("vllm", "vllm/model_executor/models/llama_eagle3.py", 414,
         "[norm(chunk) for norm, chunk in zip(self.model.fc_norm, chunks)],"),
        ("vllm", "vllm/transformers_utils/configs/speculators/algos.py", 37,
         'pre_trained_config["fc_norm"] = config_dict.get("fc_norm", False)'),
        ("sglang", "sglang/srt/models/llama_eagle3.py", 185,
         'use_fc_norm = getattr(config, "fc_norm", None) or getattr('),
        ("sglang", "sglang/srt/models/llama_eagle3.py", 191,
         "RMSNorm(self.hidden_size_in, eps=config.rms_norm_eps)"),
        ("sglang", "sglang/srt/models/llama_eagle3.py", 244,
         "[norm(chunk) for norm, chunk in zip(self.fc_norm, chunks)],"),
        ("sglang", "sglang/srt/models/llama_eagle3.py", 340, '"aux_norm_low": "fc_norm.0",'),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "engine,rel,line,text",
    [pytest.param(*x, marks=requires_engine(x[0])) for x in ENGINE_LINES],
)
def test_the_engine_lines_the_variants_mirror_are_installed(engine, rel, line, text):
    """The source lines model.py and export.py cite (a changed engine version fails here, not
    silently in serving). SGLang cannot serve EAGLE-3 on CPU, so these lines are its check."""
    assert text in engine_file_lines(engine, rel)[line - 1]
