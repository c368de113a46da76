"""eagle3nb.drafter.card and .hub: serving commands carry this run's paths, k and each engine's ids
(and parse back); the model card has Hub YAML front matter, the target's sha256, boundaries and
ids, acceptance; the upload helper builds the right CommitOperationAdd list without sending (dry
run), rewrites the verifier for the Hub, refuses without a token, and refuses a broken folder."""

import json

import pytest
import torch

from eagle3nb.drafter.card import (
    model_card,
    serve_commands,
    serve_commands_markdown,
    vllm_command_args,
)
from eagle3nb.drafter.export import export_drafter
from eagle3nb.drafter.hub import build_operations, upload_drafter
from eagle3nb.drafter.model import DrafterConfig, Eagle3Drafter


@pytest.fixture
def exported(target, tmp_path):
    model, _, path = target
    c = DrafterConfig.for_target(model.config, 256, num_attention_heads=2, num_key_value_heads=2)
    man = {
        "target": {
            "name": path.name,
            "path": str(path),
            "architecture": "LlamaForCausalLM",
            "sha256": "ab" * 32,
        }
    }
    d = Eagle3Drafter(c, None)
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[:256] = True
    d.set_vocab(torch.zeros(256, dtype=torch.long), t2d)  # draft id i = target id i
    out = export_drafter(d, tmp_path / "drafter", [1, 2, 4], 5, man, 1, 2)
    return out, json.loads((out / "config.json").read_text()), man


def test_commands_and_card(exported):
    out, cfg, man = exported
    cmds = serve_commands("/m/target", str(out), 4)
    assert vllm_command_args(cmds["vllm"]) == {
        "model": "/m/target",
        "speculative_config": {"method": "eagle3", "model": str(out), "num_speculative_tokens": 4},
    }
    assert vllm_command_args(cmds["vllm_cpu"]) == vllm_command_args(cmds["vllm"])
    assert vllm_command_args(cmds["vllm_drafter_only"]) == {
        "model": str(out),
        "speculative_config": None,
    }
    assert (
        "--speculative-num-steps 4" in cmds["sglang"]
        and "--speculative-num-draft-tokens 5" in cmds["sglang"]
    )
    md = serve_commands_markdown("r", cfg, "/m/target", str(out), 4)
    assert "SGLang ids [0, 1, 3]" in md and "vLLM ids [1, 2, 4]" in md and cmds["vllm"] in md
    ev = {"k": 5, "n_prompts": 3, "engine": "sim", "tau": 2.5, "draft_acceptance_rate": 0.3,
          "per_position_acceptance": [0.5, 0.4, 0.3, 0.2, 0.1], "conditional_acceptance": [0.5, 0.8, 0.75, 2 / 3, 0.5]}  # fmt: skip
    card = model_card(cfg, man["target"], "d", "b", cmds, ev, base_model="org/target")
    head = card.split("---")[1]
    assert "base_model: org/target" in head and "- eagle3" in head and card.startswith("---\n")
    assert (
        "ab" * 32 in card
        and "boundaries [1, 2, 4]" in card
        and "0.500 0.800 0.750 0.667 0.500" in card
    )
    assert "Not evaluated yet" in model_card(cfg, man["target"], "d", "b", cmds)


def test_upload_dry_run_builds_operations_and_refuses_without_token(exported, monkeypatch):
    from huggingface_hub import CommitOperationAdd

    out, _, _ = exported
    with pytest.raises(FileNotFoundError, match="README.md"):
        build_operations(out)
    (out / "README.md").write_text("---\ntags: [eagle3]\n---\n# card\n")
    ops = build_operations(out, verifier_name_or_path="org/target")
    assert all(isinstance(o, CommitOperationAdd) for o in ops)
    assert [o.path_in_repo for o in ops] == [
        "config.json",
        "model.safetensors",
        "README.md",
        "manifest.json",
    ]
    cfg = json.loads(
        ops[0].path_or_fileobj.getvalue()
        if hasattr(ops[0].path_or_fileobj, "getvalue")
        else ops[0].path_or_fileobj
    )
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/target"
    assert (
        json.loads((out / "config.json").read_text())["speculators_config"]["verifier"][
            "name_or_path"
        ]
        != "org/target"
    )
    r = upload_drafter(out, "org/drafter")  # dry run: nothing sent, no token needed
    assert r["dry_run"] and r["commit_url"] is None and r["create_pr"] and len(r["operations"]) == 4
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with pytest.raises(PermissionError, match="token"):
        upload_drafter(out, "org/drafter", dry_run=False)
    (out / "model.safetensors").write_bytes(b"")  # broken folder
    with pytest.raises(Exception):
        build_operations(out)
