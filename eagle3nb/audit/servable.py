"""What each engine really does with a drafter folder beyond reading its ids (issue 43 items 3-5):
the states it captures for those ids (one per distinct layer, in layer order), whether it loads the
folder at all, and whether it can serve it on CPU.

Read in the installed engines' sources (vLLM 0.32.0 ``vllm/``, SGLang 0.5.23 ``sglang/srt/``):

- **One state per distinct layer.** vLLM stores the ids as ``tuple(sorted(set(layers)))``
  (``model_executor/models/interfaces.py:1577-1578``) and appends a state when ``layer_idx in
  self.aux_hidden_state_layers`` (``1601-1611``, called in layer order, ``llama.py:427-441``); its
  default ids ``(2, N//2, N-3)`` (``interfaces.py:1712-1733``) go through the same setter. SGLang
  captures inside its layer loop ``if i in self.layers_to_capture`` (``models/llama.py:486-493``),
  once per layer, in layer order, for explicit ids and its default ``[2, N//2, N-3]``
  (``llama.py:929-941``) alike. So on a 5-layer target both defaults [2, 2, 2] give one state; on
  4 layers [2, 2, 1] two; on 6 [2, 3, 3] two.
- **Too few states.** vLLM always applies ``fc`` (``llama_eagle3.py:397-418``
  ``combine_hidden_states``), sized ``target_hidden_size * num_aux_hidden_states`` (``209-221``,
  ``242-243``):
  fewer states crash the first draft with a shape error. SGLang applies ``fc`` (and ``input_norm``,
  ``fc_norm``) only when the width differs from the embedding's (``llama_eagle3.py:238-247``):
  a single state of the target's width skips them, and the drafter serves on that raw state
  (measured by the audit as served: :func:`unfused_drafter`); two states of three crash like vLLM.
- **Loading.** vLLM creates ``draft_id_to_target_id`` only when ``draft_vocab_size`` differs from
  the target's vocabulary (``llama_eagle3.py:339-345``) and its loader renames a stored ``d2t`` to
  it (``426-429``), so a full-vocabulary folder carrying ``d2t`` fails the load ("There is no module
  or parameter named 'draft_id_to_target_id'", ``model_executor/models/utils.py:442-447``); the
  audit's copy drops them (:func:`eagle3nb.audit.formats.loadable_copy`). SGLang loads config.json
  through transformers' AutoConfig, which needs a top-level ``model_type`` (transformers 5.19
  ``models/auto/configuration_auto.py:444``), which speculators folders lack.
- **CPU.** vLLM 0.32's CPU attention takes head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256
  and 512 only (``v1/attention/backends/cpu_attn.py:69-70``,
  :data:`eagle3nb.boundaries.cpu_limits.VLLM_CPU_HEAD_SIZES`), the drafter's layer as the
  target's; the target classes' CPU limits are :func:`eagle3nb.boundaries.cpu_limits.cpu_limit`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from eagle3nb.boundaries.cpu_limits import cpu_config_limit, cpu_drafter_limit

__all__ = [
    "fed_states",
    "load_refusal",
    "cpu_refusal",
    "unfused_drafter",
    "full_vocab_without_d2t",
    "annotate_readings",
    "weights_fix",
]

_SRC = {
    "vllm": "vllm/model_executor/models/interfaces.py:1577-1578, 1601-1611",
    "sglang": "sglang/srt/models/llama.py:486-493",
}


def fed_states(engine: str, version: str, boundaries: list[int], n_aux: int, width_ok: bool):
    """The states ``engine`` feeds a drafter reading ``n_aux`` states when its ids name
    ``boundaries`` (in id order, by the engine's id rule): one per distinct boundary, in layer order
    (module docstring).

    Args:
        width_ok: the target's hidden size equals the drafter's (SGLang's fc skip needs it).

    Returns:
        ``{"boundaries": sorted distinct boundaries, "unfused": bool, "note": str | None}``;
        ``unfused``: SGLang's single state served without ``fc``.

    Raises:
        ValueError: a count of states the engine cannot serve to this drafter (why, with sources).
    """
    got = sorted(set(boundaries))
    note = None
    if got != list(boundaries) and len(got) == len(boundaries):
        note = f"ids name {list(boundaries)}; {engine} captures them in layer order: {got}"
    if len(got) == n_aux:
        return {"boundaries": got, "unfused": False, "note": note}
    dup = (
        f"{engine} {version} captures one state per distinct layer ({_SRC[engine]}): boundaries "
        f"{list(boundaries)} give {len(got)} state{'s' if len(got) > 1 else ''} {got}, and the "
        f"drafter reads {n_aux}"
    )
    if engine == "sglang" and len(got) == 1 and width_ok:
        return {
            "boundaries": got,
            "unfused": True,
            "note": f"{dup}; one state has the embedding's width, so SGLang skips fc (and "
            "input_norm, fc_norm: srt/models/llama_eagle3.py:238-247) and the drafter reads "
            f"boundary {got[0]} raw: served without error, at the tau measured so",
        }
    crash = (
        "vllm/model_executor/models/llama_eagle3.py:397-418 applies fc (242-243)"
        if engine == "vllm"
        else "srt/models/llama_eagle3.py:238-247 applies fc"
    )
    raise ValueError(
        f"{dup}; {crash} sized for {n_aux} states, so the first draft fails with a shape error. "
        "Write the ids explicitly (the audit's corrected copy does)"
    )


def load_refusal(engine: str, version: str, cfg: dict, has_d2t: bool, full_vocab: bool):
    """Why ``engine`` refuses to load a drafter folder (``cfg``: its config.json; ``has_d2t``: its
    model.safetensors holds ``d2t``; ``full_vocab``: its draft vocabulary is the target's), or None
    (module docstring, Loading)."""
    if engine == "vllm" and has_d2t and full_vocab:
        return (
            f"vllm {version} does not load it: a full-vocabulary drafter with d2t/t2d (SpecForge "
            'writes them always) fails with "There is no module or parameter named '
            "'draft_id_to_target_id'\": vLLM creates that parameter only when draft_vocab_size "
            "differs from the target's vocab (model_executor/models/llama_eagle3.py:339-345) and "
            "maps d2t to it (426-429); the corrected copy drops them, as 03's export does"
        )
    if engine == "sglang" and "speculators_config" in cfg and "model_type" not in cfg:
        return (
            f"sglang {version} does not load it: config.json has no top-level model_type "
            "(speculators nests it in transformer_layer_config), and transformers' AutoConfig "
            'refuses it ("Should have a `model_type` key in its config.json", transformers 5.19 '
            "models/auto/configuration_auto.py:444); serve the corrected copy"
        )
    return None


def cpu_refusal(engine: str, version: str, arch: str, target_cfg: dict, drafter_cfg: dict):
    """Why ``engine`` at ``version`` cannot serve this drafter (``drafter_cfg``: config.json in
    eagle3nb's form) beside a target of class ``arch`` (``target_cfg``: its text config) on CPU,
    as eagle3nb knows it (:mod:`eagle3nb.boundaries.cpu_limits`); None where nothing is known."""
    use = "serve_mla" if "kv_lora_rank" in drafter_cfg else "serve"
    why = cpu_config_limit(engine, version, arch, target_cfg, use)
    return why or cpu_drafter_limit(engine, version, drafter_cfg)


def unfused_drafter(d):
    """A copy of the drafter ``d`` as SGLang runs it on one state of the target's width: ``fc``
    the identity, no ``input_norm`` or ``fc_norm`` (``srt/models/llama_eagle3.py:238-247``), so
    :func:`eagle3nb.audit.measure.measure_candidates` at a one-boundary set measures what SGLang
    serves. Same device and mode.

    Raises:
        ValueError: the drafter's width differs from the target's (SGLang then applies fc).
    """
    c = d.config
    if c.target_hidden_size != c.hidden_size:
        raise ValueError(
            f"target_hidden_size={c.target_hidden_size} != hidden_size={c.hidden_size}: "
            "SGLang applies fc to a single state of another width"
        )
    uc = replace(c, n_aux=1, norm_before_fc=False, fc_norm=False)
    keep = {
        k: v
        for k, v in d.state_dict().items()
        if not k.startswith(("fc.", "input_norm.", "fc_norm."))
    }
    out = type(d)(uc).to(d.embed_tokens.weight.device)
    keep["fc.weight"] = torch.eye(c.hidden_size, dtype=d.fc.weight.dtype, device=d.fc.weight.device)
    out.load_state_dict(keep)
    return out.train(d.training)


def full_vocab_without_d2t(sd: dict) -> dict:
    """A full-vocabulary state dict without ``d2t``/``t2d``: ``lm_head.weight`` rows moved to the
    target ids d2t maps them to (row i -> i + d2t[i]; identity d2t, as SpecForge writes it, moves
    nothing), the same function with the vocab tensors vLLM 0.32 cannot load dropped
    (``model_executor/models/llama_eagle3.py:339-345, 426-429``; 03's export writes none)."""
    out = {k: v for k, v in sd.items() if k not in ("d2t", "t2d")}
    if "d2t" in sd and bool(sd["d2t"].any()) and "lm_head.weight" in sd:
        tgt = torch.arange(sd["d2t"].numel()) + sd["d2t"].long()
        head = torch.empty_like(sd["lm_head.weight"])
        head[tgt] = sd["lm_head.weight"]
        out["lm_head.weight"] = head
    return out


def annotate_readings(readings: dict, folder, n_aux: int, width_ok: bool, arch, tcfg) -> None:
    """Each engine's reading (:func:`eagle3nb.audit.measure.engine_readings`) of ``folder`` (a
    :class:`eagle3nb.audit.formats.DrafterFolder`) made what the engine does, in place:
    ``boundaries`` become the states it captures (:func:`fed_states`; ``ids_boundaries`` keeps what
    the ids name when they differ, ``unfused`` marks SGLang's single state), ``refused`` is set
    where it cannot load or serve the folder as published (:func:`load_refusal`, a count of states
    it crashes on), ``cpu_refused`` where it cannot serve this drafter on CPU
    (:func:`cpu_refusal`)."""
    from safetensors import safe_open

    with safe_open(str(folder.path / "model.safetensors"), "pt") as f:
        has_d2t = "d2t" in f.keys()
    c = folder.plain
    full = int(c.get("draft_vocab_size") or c["vocab_size"]) == int(c["vocab_size"])
    for engine, r in readings.items():
        r["cpu_refused"] = cpu_refusal(engine, r["version"], arch, tcfg, c)
        why = load_refusal(engine, r["version"], folder.config, has_d2t, full)
        if "boundaries" in r and why is None:
            try:
                got = fed_states(engine, r["version"], r["boundaries"], n_aux, width_ok)
            except ValueError as e:
                why = str(e)
            else:
                if got["boundaries"] != r["boundaries"]:
                    r["ids_boundaries"] = r["boundaries"]
                r.update(boundaries=got["boundaries"], unfused=got["unfused"], note=got["note"])
        if why is not None and "refused" not in r:
            if "boundaries" in r:
                r["ids_boundaries"] = r.pop("boundaries")
            r["refused"] = why


def weights_fix(p: Path, f: Path) -> str:
    """How to make ``p`` readable: weights are read from model.safetensors only; a PyTorch pickle
    (EAGLE's official drafters ship ``pytorch_model.bin``) is converted with torch's safe loader."""
    if f.name != "model.safetensors" or not (p / "pytorch_model.bin").is_file():
        return "point at a drafter folder (config.json and model.safetensors)"
    return (
        "eagle3nb reads drafter weights from model.safetensors only, and this folder has "
        "pytorch_model.bin: convert it once (torch's safe loader, no code runs from the file): "
        'python -c "import torch; from safetensors.torch import save_file; sd = torch.load('
        f"'{p}/pytorch_model.bin', map_location='cpu', weights_only=True); save_file({{k: "
        f"v.contiguous() for k, v in sd.items()}}, '{p}/model.safetensors', {{'format': 'pt'}})\""
    )
