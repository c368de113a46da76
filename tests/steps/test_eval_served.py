"""04's served acceptance (eagle3nb/steps/evaluate/served.py): counters summed per category and batch
size as the definitions say, the offset copy's ids, who measures under [auto], and a 04 that
loads no target weights when the simulator is off."""

import json
import shutil

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from testkit import requires_engine
from eagle3nb.boundaries.engine_read import read_as_engine
from eagle3nb.steps.evaluate import bench as eval_bench
from eagle3nb.steps.evaluate.bench import target_parameters
from eagle3nb.steps.evaluate.served import offset_drafter_dir, serve_engine


def test_target_parameters_equals_torch_numel(tmp_path):
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    m = LlamaForCausalLM(cfg)
    m.save_pretrained(tmp_path)
    assert target_parameters(tmp_path) == sum(p.numel() for p in m.parameters())


class FakeServingClient:
    """A fake engine (unit tests only): prompt i's request accepts ``acc[i]`` drafts of k at its
    only cycle, so the expected counters are known by hand; plain greedy = the served output
    unless ``differ`` names the prompt."""

    def __init__(self, acc, differ=()):
        self.acc, self.differ, self.calls = acc, set(differ), []

    def info(self):
        return {"engine_version": "0.0-fake"}

    def _idx(self, q):
        return q[0]

    def serve_acceptance(self, folder, prompts, k, max_new, eos):
        self.calls.append(("serve", len(prompts)))
        per = [0] * k
        for q in prompts:
            for j in range(min(self.acc[self._idx(q)], k)):
                per[j] += 1
        n_acc = sum(min(self.acc[self._idx(q)], k) for q in prompts)
        return {
            "outputs": [[q[0], 1] for q in prompts],
            "num_drafts": len(prompts),
            "num_draft_tokens": k * len(prompts),
            "num_accepted_tokens": n_acc,
            "accepted_per_pos": per,
        }

    def generate(self, prompts, max_new, eos, t, top_p, seed):
        self.calls.append(("plain", len(prompts)))
        return [[q[0], 2 if q[0] in self.differ else 1] for q in prompts]


def test_serve_engine_sums_each_category_by_hand():
    prompts = [[0], [1], [2], [3], [4]]
    cats = ["a", "a", "b", "b", "b"]
    fake = FakeServingClient(acc=[5, 1, 0, 2, 3], differ=[3])
    drafters = {"trained": ("dir", [3], [2])}
    runs, outs = serve_engine(fake, "vllm", drafters, prompts, cats, [2], 8, [0])
    by = {r["category"]: r for r in runs}
    # a: accepted min(5,3)=3 and 1 over 2 cycles -> tau 1 + 4/2 = 3; a_1 = 2/2, a_2 = a_3 = 1/2
    assert by["a"]["tau"] == 3.0 and by["a"]["per_position_acceptance"] == [1.0, 0.5, 0.5]
    # b: 0 + 2 + 3 over 3 cycles -> tau 1 + 5/3; a_1 = 2/3, a_2 = 2/3, a_3 = 1/3
    assert by["b"]["tau"] == round(1 + 5 / 3, 4)
    assert by["b"]["per_position_acceptance"] == [0.6667, 0.6667, 0.3333]
    # all: 9 accepted over 5 cycles
    assert by["all"]["tau"] == 2.8 and by["all"]["cycles"] == 5
    # prompt 3 (category b) differs from the engine's plain greedy output
    assert (by["a"]["greedy_mismatches"], by["b"]["greedy_mismatches"]) == (0, 1)
    assert by["all"]["greedy_mismatches"] == 1
    # batch size 2 within each category: a -> 1 call of 2; b -> 2 calls (2 + 1); plus warm-ups
    serves = [n for kind, n in fake.calls if kind == "serve"]
    assert serves == [1, 2, 2, 1]
    assert all(r["latency_s"] is not None for r in runs)
    # one worker: with and without at different moments, one pass each: never a speedup
    assert all(r["speedup"] is None for r in runs)
    assert by["all"]["speed"]["speedup"]["verdict"] == "one pass"
    assert by["all"]["speed"]["timed_on"] == "one pass each, at different moments (one worker)"


def test_serve_engine_pairs_spread_prompts_with_a_plain_worker_turn_about():
    prompts = [[0], [1], [2], [3], [4]]
    cats = ["a", "a", "b", "b", "b"]
    fake = FakeServingClient(acc=[5, 1, 0, 2, 3])
    plain = FakeServingClient(acc=[0] * 5, differ=[2, 3])
    drafters = {"trained": ("dir", [3], [1]), "offset": ("dir2", [3], [1])}
    runs, outs = serve_engine(
        fake, "vllm", drafters, prompts, cats, [1], 8, [0], plain=plain, rounds=3, speed_prompts=2
    )
    # 2 of 5 prompts spread over the set (indices int(j * 5 / 2): 0 and 2) are paired per
    # setting; the drafter's worker serves every prompt and never a plain request
    assert [kind for kind, _ in fake.calls] == ["serve"] * (1 + 5 + 1 + 5)
    assert plain.calls == [("plain", 1)] * (1 + 2 + 2)  # warm-up, trained's 2, offset's 2
    by = {(r["drafter"], r["category"]): r for r in runs}
    sp = by["trained", "all"]["speed"]
    assert sp["pairs"] == 2
    assert sp["timed_on"] == "the calls of 2 prompts spread over the set (a subset)"
    assert sp["speedup"]["rounds"] == 2 and len(sp["speedup"]["values"]) == 2  # 2 pairs, 2 rounds
    assert by["offset", "all"]["speed"]["pairs"] == 2
    # the bound of a speedup is that serving's tau (<= k + 1)
    assert sp["speedup"]["bound"] == by["trained", "all"]["tau"]
    # the plain outputs exist for the paired prompts only: the engine's greedy check covers them
    assert outs["plain", 1] == [[0, 1], None, [2, 2], None, None]
    assert (by["trained", "a"]["greedy_compared"], by["trained", "b"]["greedy_compared"]) == (1, 1)
    assert by["trained", "all"]["greedy_compared"] == 2
    # prompt 2 differs from the plain output (prompt 3 too, but it was not paired)
    assert by["trained", "b"]["greedy_mismatches"] == 1
    assert by["trained", "all"]["greedy_mismatches"] == 1


def test_serve_engine_pairs_every_call_when_the_set_is_small():
    prompts, cats = [[0], [1], [2]], ["a", "a", "b"]
    fake, plain = FakeServingClient(acc=[1, 2, 3]), FakeServingClient(acc=[0] * 3)
    drafters = {"trained": ("dir", [3], [1])}
    runs, outs = serve_engine(
        fake, "vllm", drafters, prompts, cats, [1], 8, [0], plain=plain, rounds=3, speed_prompts=16
    )
    sp = {r["category"]: r for r in runs}["all"]["speed"]
    assert sp["pairs"] == 3 and sp["timed_on"] == "every call of the whole set"
    assert outs["plain", 1] == [[0, 1], [1, 1], [2, 1]]


def _drafter_dir(tmp_path, bnds, n):
    d = tmp_path / "drafter"
    d.mkdir()
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "eagle_aux_hidden_state_layer_ids": list(bnds),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [b - 1 for b in bnds]},
        "eagle3nb": {"aux_boundaries": list(bnds)},
    }
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes(b"weights")
    return d


def test_offset_copy_ids_read_one_layer_off(tmp_path):
    # SGLang-trained [1, 2, 4] on 5 layers; its offset is vLLM's reading of the same ids: [0, 1, 3]
    d = _drafter_dir(tmp_path, [1, 2, 4], 5)
    reads = offset_drafter_dir(d, tmp_path / "off", [0, 1, 3], 5, None)
    cfg = json.loads((tmp_path / "off" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]  # vLLM id L = boundary L
    # SGLang captures the input of layer id + 1 (models/llama.py): id -1 is boundary 0
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 0, 2]
    assert read_as_engine(cfg, "vllm", 5)["boundaries"] == [0, 1, 3]
    assert reads == {"vllm": [0, 1, 3], "sglang": [0, 1, 3]}
    assert (tmp_path / "off" / "model.safetensors").read_bytes() == b"weights"
    assert not (tmp_path / "off.tmp").exists()


def test_auto_leaves_out_a_simulator_whose_target_does_not_fit(monkeypatch, tmp_path):
    from eagle3nb.params import RunParams

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "t")
    n = target_parameters(tmp_path / "t")
    monkeypatch.setattr(eval_bench, "_free_bytes", lambda device: 4 * n)  # needs half of it
    monkeypatch.setattr(eval_bench, "_engine_reason", lambda *a: "not here (test)")
    p = RunParams()
    got, why = eval_bench.resolve_eval_engines(p, tmp_path / "t", {}, "cpu")
    assert got == [] and why["simulator"].startswith("a float32 HF copy needs")
    monkeypatch.setattr(eval_bench, "_free_bytes", lambda device: 8 * n)
    assert eval_bench.resolve_eval_engines(p, tmp_path / "t", {}, "cpu")[0] == ["simulator"]
    q = p.model_copy(update={"eval_engines": ["sglang"]})
    assert eval_bench.resolve_eval_engines(q, tmp_path / "t", {}, "cpu") == (["sglang"], {})


@requires_engine("vllm")
def test_04_without_the_simulator_loads_no_target_weights(smoke_run, tmp_path, monkeypatch):
    """The smoke run's drafter served by vLLM alone, with every HF weight load forbidden: 04
    still reports vLLM's own tau, the same as the smoke run's vLLM-served tau; and on a
    random-weight target of the same shape (a stand-in for one too large for an HF copy), vLLM's
    own counters, consistent and with served output equal to its plain greedy output."""
    import transformers

    from eagle3nb.params import load_params
    from eagle3nb.repo_paths import REPO_ROOT
    from eagle3nb.steps.evaluate.step import eval_step
    from eagle3nb.target import models

    def forbidden(*a, **k):
        raise AssertionError("04 loaded target weights with the simulator off")

    monkeypatch.setattr(models, "load_target", forbidden)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", forbidden)
    run = tmp_path / "smoke"
    shutil.copytree(smoke_run, run, ignore=shutil.ignore_patterns("recorded", "notebooks"))
    p = load_params(REPO_ROOT / "params" / "smoke.yaml").model_copy(
        update={
            "outputs_dir": str(tmp_path),
            "eval_engines": ["vllm"],
            "baselines": False,
            "k_sweep": False,
            "interactive": False,
        }
    )
    out = eval_step(p, progress=False)
    s = out["stats"]
    v = s["served_by"]["vllm"]
    want = json.loads((smoke_run / "metrics.json").read_text())["eval"]["served_by"]["vllm"]
    assert v["tau"] == want["tau"] and v["counters"] == want["counters"]
    assert v["greedy_mismatches_vs_engine_plain"] == 0 and "simulator_tau" not in v
    assert set(s["tau"]) == {f"trained, served by vLLM {v['engine_version']}"}
    assert "trained" not in s["engines"] and s["served"]["engines"] == ["vllm"]
    # a random-weight target: its weights exist only as a folder the engine loads
    tgt = tmp_path / "random-target"
    src = models.resolve_model(p.model)
    tgt.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy2(f, tgt / f.name)
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.from_pretrained(src)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tgt)  # save, not load: allowed
    q = p.model_copy(update={"model": str(tgt), "allow_template_mismatch": True})
    s = eval_step(q, progress=False)["stats"]
    v = s["served_by"]["vllm"]
    c = v["counters"]
    assert c["num_drafts"] > 0 and sum(c["accepted_per_pos"]) == c["num_accepted_tokens"]
    assert v["tau"] == round(1 + c["num_accepted_tokens"] / c["num_drafts"], 4)
    assert v["greedy_mismatches_vs_engine_plain"] == 0 and s["served"]["engines"] == ["vllm"]
