"""03 starting from a drafter someone else trained (``init_from``): read it in any format peers
publish (:mod:`eagle3nb.audit.formats`: eagle3nb's export, SpecForge/SGLang ``eagle_config``,
speculators' ``speculators_config``, vLLM's top-level ids, no ids; either head: Llama (GQA) or
the MLA drafter of DeepSeek-V3 / Kimi-K2 targets, :mod:`eagle3nb.drafter.mla`, also with SGLang's
``layers.0.*`` weight names), refuse it for another target, decide its boundaries, and hand the
loop its weights.

Boundaries (``init_boundaries``):

- ``keep`` (default): the boundaries the folder declares, read as the audit reads them
  (:func:`eagle3nb.audit.formats.read_drafter_folder`: eagle3nb's recorded ``aux_boundaries``, the
  top-level ids as vLLM reads them, SGLang's nested ids by its rule for the target's class: + 1 on
  Llama, unshifted on DeepSeek unless the first id is 1). The run must capture and export those
  same boundaries; anything else is refused before any work, since fine-tuning it on other tensors
  than it was trained on silently turns it into another drafter. A folder without ids declares
  nothing: the audit measures which set it was trained on, and its corrected copy declares it.
- ``params``: the run's boundaries. Where they differ from the declared ones (or nothing is
  declared) the drafter is *moved*: the input side that reads the target's states (``fc``, and
  ``input_norm`` / ``fc_norm`` where the drafter has them) starts fresh as in a new drafter of the
  run's seed and is re-trained on the new boundaries; the decoder layer, norms, ``lm_head`` and
  vocabulary maps are kept (an MLA drafter's fresh input side is that of a new MLA drafter).

The drafter's own draft vocabulary (``d2t``/``t2d``, ``lm_head`` rows), widths, flags and head are
kept either way; run parameters that say otherwise (``draft_vocab_size``, the norm flags,
``drafter_head``) are listed in the record's ``kept_from_drafter``.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import torch

from eagle3nb.audit.formats import check_belongs, loadable_copy, read_drafter_folder
from eagle3nb.drafter.export import load_drafter
from eagle3nb.drafter.mla import MLAConfig, make_drafter
from eagle3nb.drafter.model import Eagle3Drafter
from eagle3nb.drafter.vocab import count_loss_tokens, coverage
from eagle3nb.manifest import sha256_file
from eagle3nb.target.models import ARCH_ALIASES

__all__ = [
    "INIT_BOUNDARIES",
    "INPUT_SIDE",
    "weights_sha256",
    "other_target",
    "adoption_plan",
    "adopt_drafter",
]

INIT_BOUNDARIES = ("keep", "params")
# parameter names of the part that reads the target's states (re-initialised when moved)
INPUT_SIDE = ("fc.", "input_norm.", "fc_norm.")
_FLAGS = ("norm_before_fc", "norm_output", "fc_norm")


def weights_sha256(folder: str | os.PathLike) -> str:
    """sha256 hex of ``folder``/model.safetensors (:func:`eagle3nb.manifest.sha256_file`)."""
    return sha256_file(Path(folder) / "model.safetensors")


def _check_vocab_maps(folder) -> None:
    """``d2t`` as long as ``draft_vocab_size`` (SGLang and vLLM index it by draft id)."""
    from safetensors import safe_open

    with safe_open(str(folder.path / "model.safetensors"), "pt") as f:
        if "d2t" not in f.keys():
            return
        n = f.get_slice("d2t").get_shape()[0]
    dv = folder.plain.get("draft_vocab_size", folder.plain.get("vocab_size"))
    if int(n) != int(dv):
        raise ValueError(
            f"init_from={str(folder.path)!r}: d2t has {n} entries but config.json draft_vocab_size="
            f"{dv}: the vocabulary map belongs to another drafter (draft_vocab_size must equal "
            "d2t's length)"
        )


def other_target(path: str | os.PathLike, target: dict) -> str | None:
    """Why the drafter at ``path`` was trained for another target than ``target`` (``{"name",
    "sha256"}``), from the ``target`` block of its manifest.json (eagle3nb's export writes name,
    path and sha256 of config.json and weights, :func:`eagle3nb.target.models.model_hash`): the
    sha256 where both have one (the same name can be another checkpoint: base vs instruct, another
    quantisation), else the name (or the folder name of ``path``). None when they agree or the
    folder has no manifest (a peer's drafter: only the shapes are checked, by
    :func:`eagle3nb.audit.formats.check_belongs`)."""
    import json

    man = Path(path) / "manifest.json"
    if not man.is_file():
        return None
    theirs = (json.loads(man.read_text()) or {}).get("target") or {}
    t_name = theirs.get("name") or Path(str(theirs.get("path") or "")).name or None
    t_sha, sha, name = theirs.get("sha256"), target.get("sha256"), target.get("name")
    if t_sha and sha:
        if t_sha == sha:
            return None
        why = f"sha256 {t_sha[:12]} vs this run's {sha[:12]}"
    elif t_name and name and t_name != Path(str(name)).name:
        why = "by name (no sha256 on one side)"
    else:
        return None
    return (
        f"init_from={str(path)!r} was trained for target {t_name!r} and this run's target is "
        f"{name!r} ({why}; {man}): the shapes agree, but its weights learned another model's "
        "hidden states. Use the drafter made for this target"
    )


def adoption_plan(
    path: str | os.PathLike,
    target_cfg: dict,
    tokenizer_size: int,
    run_boundaries: Sequence[int],
    init_boundaries: str = "keep",
    layer_ids_hint: Callable[[list[int]], str | None] | None = None,
    target: dict | None = None,
    on_other_target: str = "refuse",
) -> dict:
    """Read and check the drafter at ``path`` for this target and run, before any work.

    Args:
        target_cfg: the target's text config (``hidden_size``, ``vocab_size``,
            ``num_hidden_layers``); tokenizer_size: ``len(tokenizer)``.
        run_boundaries: the boundaries this run captures and exports (its ``aux_boundaries``).
        init_boundaries: ``keep`` or ``params`` (module docstring).
        layer_ids_hint: declared boundaries -> how to make the run capture them (e.g.
            ``layer_ids: [0, 1, 3] (convention sglang)``, or None), named in the keep refusal.
        target: this run's target ``{"name", "sha256"}`` (either may be absent), compared with
            the ``target`` of the folder's manifest.json where it has one (:func:`other_target`).
        on_other_target: ``refuse`` or ``warn`` (params ``init_from_target``) when they differ.

    Returns:
        the manifest record ``{"path", "format", "sha256" (model.safetensors), "declared",
        "declared_how", "init_boundaries", "boundaries" (trained on here), "moved",
        "reinitialised" (parameter prefixes started fresh), "n_aux", "target_num_hidden_layers"}``.

    Raises:
        FileNotFoundError: no folder, config.json or model.safetensors.
        ValueError: ``init_boundaries`` unknown; with ``on_other_target="refuse"`` a manifest
            naming another target (:func:`other_target`, both named); a drafter for another
            target, naming the field
            (``hidden_size``/``target_hidden_size``, ``vocab_size``, ``draft_vocab_size`` vs
            ``d2t``, ``eagle3nb.target_num_hidden_layers``, flags; an MLA drafter's ranks such as
            ``kv_lora_rank`` or a target without MLA; before any weight is read);
            with ``keep``: no declared boundaries, or declared ones other than the run's.
    """
    if init_boundaries not in INIT_BOUNDARIES:
        raise ValueError(f"init_boundaries={init_boundaries!r}: use keep or params")
    n = int(target_cfg["num_hidden_layers"])
    arch = (target_cfg.get("architectures") or [None])[0]  # SGLang's ids by its rule for it
    folder = read_drafter_folder(path, n, ARCH_ALIASES.get(arch, arch))
    check_belongs(folder, target_cfg, tokenizer_size)
    _check_vocab_maps(folder)
    if on_other_target not in ("refuse", "warn"):
        raise ValueError(f"init_from_target={on_other_target!r}: use refuse or warn")
    other = other_target(folder.path, target or {})
    if other and on_other_target == "refuse":
        raise ValueError(f"{other}; or set init_from_target: warn to fine-tune it anyway")
    if other:
        warnings.warn(other, stacklevel=2)
    run, dec = [int(b) for b in run_boundaries], folder.declared
    where = f"init_from={str(folder.path)!r} ({folder.format} format, {folder.declared_how})"
    if init_boundaries == "keep" and dec is None:
        raise ValueError(
            f"{where}: declares no boundaries, so init_boundaries=keep has nothing to keep; run "
            f"`python -m eagle3nb.audit {folder.path} --model TARGET --out DIR` and set init_from "
            "to DIR/drafter (the audit's corrected copy declares the boundaries it measured), or "
            f"set init_boundaries: params to re-train its fc on this run's boundaries {run}"
        )
    if init_boundaries == "keep" and dec != run:
        hint = layer_ids_hint(dec) if layer_ids_hint else None
        how = f" ({hint})" if hint else ""
        raise ValueError(
            f"{where}: trained on boundaries {dec}, but this run captures and exports boundaries "
            f"{run} (aux_boundaries); fine-tuned there it would read other tensors than it was "
            f"trained on. Make the run capture {dec}{how}, or set init_boundaries: params to move "
            f"it to {run} (its fc's input side is re-initialised and re-trained)"
        )
    moved = dec != run
    c = folder.plain
    n_aux = int(c.get("num_aux_hidden_states") or (len(dec) if dec else 3))
    return {
        "path": str(folder.path.resolve()),
        "format": folder.format,
        "sha256": weights_sha256(folder.path),
        "declared": dec,
        "declared_how": folder.declared_how,
        "init_boundaries": init_boundaries,
        "boundaries": run,
        "moved": moved,
        "reinitialised": [p.rstrip(".") for p in INPUT_SIDE] if moved else [],  # those it has
        "n_aux": n_aux,
        "target_num_hidden_layers": n,
        "other_target": other,
    }


def adopt_drafter(plan: dict, source, target, cfg) -> tuple[Eagle3Drafter, dict]:
    """The drafter of ``plan`` (:func:`adoption_plan`) as the loop's starting point, on the CPU in
    float32 (as :func:`eagle3nb.training.loop.build_drafter` returns a fresh one).

    Args:
        source: the batch source or dataset (``token_masks()``, ``manifest["aux_boundaries"]``).
        target: the target (its input embeddings [vocab, Ht] complete the drafter).
        cfg: the run's :class:`eagle3nb.training.loop.TrainConfig` (seed; fields it overrides).

    Returns:
        ``(drafter, vocab info)``: info as build_drafter's (coverage of the drafter's own draft
        vocabulary over the run's loss tokens) plus ``"init_from"``: ``plan`` with
        ``kept_from_drafter`` (``{field: {"params", "drafter"}}`` where they differ).

    Raises:
        ValueError: the folder's weights changed since the plan (sha256), or the run's boundary
            count differs from the drafter's while the plan keeps its boundaries.
    """
    if weights_sha256(plan["path"]) != plan["sha256"]:
        raise ValueError(f"init_from={plan['path']!r}: model.safetensors changed since preflight")
    folder = read_drafter_folder(plan["path"], plan["target_num_hidden_layers"])
    emb = target.get_input_embeddings().weight.detach().float().cpu()
    with tempfile.TemporaryDirectory(prefix="eagle3nb-init-") as tmp:
        d, _ = load_drafter(loadable_copy(folder, Path(tmp) / "drafter"), emb)
    d = d.float().cpu()
    run_aux = getattr(source, "n_aux", None) or len(source.manifest["aux_boundaries"])
    if plan["moved"]:
        torch.manual_seed(cfg.seed)  # the fresh input side a new drafter of this seed would get
        fresh = make_drafter(replace(d.config, n_aux=run_aux), emb)  # the same head (MLA too)
        keep = {k: v for k, v in d.state_dict().items() if not k.startswith(INPUT_SIDE)}
        missing, unexpected = fresh.load_state_dict(keep, strict=False)
        assert not unexpected and all(k.startswith(INPUT_SIDE) for k in missing), missing
        plan = dict(plan, reinitialised=sorted({k.split(".")[0] for k in missing}))
        d = fresh
    elif run_aux != d.config.n_aux:
        raise ValueError(
            f"init_from={plan['path']!r} reads {d.config.n_aux} aux states but the run captures "
            f"{run_aux}; set init_boundaries: params to re-train its fc on them"
        )
    counts = count_loss_tokens(source.token_masks(), d.config.vocab_size)
    kept = {
        f: {"params": getattr(cfg, f), "drafter": getattr(d.config, f, False)}
        for f in ("draft_vocab_size",) + _FLAGS
        if hasattr(cfg, f) and getattr(cfg, f) != getattr(d.config, f, False)
    }
    head = "mla" if isinstance(d.config, MLAConfig) else "llama"
    if getattr(cfg, "drafter_head", head) != head:  # the drafter's attention is kept
        kept["drafter_head"] = {"params": cfg.drafter_head, "drafter": head}
    return d, {
        "distinct_loss_tokens": int((counts > 0).sum()),
        "coverage": coverage(counts, d.t2d),
        "loss_tokens": int(counts.sum()),
        "init_from": dict(plan, kept_from_drafter=kept),
    }
