"""05_drift's sources: one (engine, dtype, quantization) target each, captured at the same
boundaries on the same tokens, and compared with the float32 HF reference.

A source spec is ``"engine:dtype[:quant]"``: engine ``hf`` (transformers in this process) or
``vllm`` (vLLM's own forward, in its venv), dtype ``float32``/``bfloat16``, quant ``none``,
``w8a8`` or ``w4a16`` (:mod:`eagle3nb.target.quantize`, written into the run folder). Each source
gives: the aux states and final state (boundary N) of 01's train samples (same tokens for every
source: the drift and logits comparisons, and each source's training data), and for every
held-out prompt its own greedy continuation with the states over prompt + continuation (what a
drafter is served with on that source).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import torch

from eagle3nb.target.quantize import FORMATS

__all__ = [
    "REFERENCE",
    "Source",
    "SourceData",
    "parse_sources",
    "capture_hf",
    "capture_vllm",
    "drift_stats",
    "figure_states",
]

REFERENCE = "hf:float32:none"  # drift and logits are measured against this source
ENGINES = ("hf", "vllm")
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Source:
    """One target variant: ``engine`` (hf, vllm), ``dtype``, ``quant`` (none or a
    :data:`eagle3nb.target.quantize.FORMATS` key)."""

    engine: str
    dtype: str
    quant: str = "none"

    @property
    def key(self) -> str:
        """``engine:dtype:quant``."""
        return f"{self.engine}:{self.dtype}:{self.quant}"

    @property
    def label(self) -> str:
        """What figures and the matrix call it (the engine that really runs first)."""
        name = {"hf": "hf-transformers", "vllm": "vllm"}[self.engine]
        return f"{name} {self.dtype}" + ("" if self.quant == "none" else f" {self.quant}")


@dataclass
class SourceData:
    """What one source gave. ``train``: per train sample ``{"input_ids", "loss_mask", "aux" [T,
    n_aux*H] float32 (the run's boundaries), "final" [T, H] float32, "sample_id"}``;
    ``heldout``: per held-out prompt ``{"full" [p + n] int64, "p", "states" {b: [p + n, H]
    float32}}`` with the source's own greedy continuation; ``engine``: the block naming what ran."""

    source: Source
    train: list[dict] = field(default_factory=list)
    heldout: list[dict] = field(default_factory=list)
    engine: dict = field(default_factory=dict)
    seconds: float = 0.0


def parse_sources(specs: list[str]) -> list[Source]:
    """Sources from ``drift_sources`` specs, the HF float32 reference first (added when absent).

    Raises:
        ValueError: a malformed spec, an unknown engine, dtype or quantization, or a duplicate
            (the message names ``drift_sources`` and the accepted form).
    """
    out = []
    for s in specs:
        parts = str(s).split(":")
        quant = parts[2] if len(parts) == 3 else "none"
        ok = len(parts) in (2, 3) and parts[0] in ENGINES and parts[1] in DTYPES
        if not ok or (quant != "none" and quant not in FORMATS):
            raise ValueError(
                f"drift_sources entry {s!r}: write engine:dtype[:quant] with engine in "
                f"{list(ENGINES)}, dtype in {list(DTYPES)}, quant none or one of "
                f"{sorted(FORMATS)} (e.g. vllm:float32:w8a8)"
            )
        src = Source(parts[0], parts[1], quant)
        if src in out:
            raise ValueError(f"drift_sources lists {src.key} twice; list each source once")
        out.append(src)
    ref = Source("hf", "float32")
    return [ref] + [s for s in out if s != ref]


def capture_hf(model, src: Source, train_samples, prompts, bnds, all_b, n_gen) -> SourceData:
    """HF capture of one source (``model`` loaded in the source's dtype, from its quantized folder
    for a quantized source: weights dequantized by compressed-tensors on load).

    Args:
        train_samples: ``(sample_id, input_ids, loss_mask)`` of 01's train records.
        prompts: held-out prompt ids. bnds: the run's aux boundaries (training); all_b: every
            boundary served (the run's and the layer-offset ones), N excluded.
        n_gen: greedy tokens generated per held-out prompt (max_new_tokens + k, unstopped).
    """
    from eagle3nb.drafter.ksweep import greedy_unstopped
    from eagle3nb.target.capture import capture_boundaries, n_layers_of

    t0 = time.time()
    n = n_layers_of(model)
    dev = next(model.parameters()).device
    data = SourceData(src)
    for sid, ids, mask in train_samples:
        st = capture_boundaries(model, torch.tensor([ids], device=dev), sorted(set(bnds + [n])))
        aux = torch.cat([st[b][0].float().cpu() for b in bnds], dim=-1)
        data.train.append(_train_item(sid, ids, mask, aux, st[n][0].float().cpu()))
    for q in prompts:
        g = greedy_unstopped(model, q, n_gen)
        full = torch.tensor(list(q) + g, dtype=torch.long)
        st = capture_boundaries(model, full[None].to(dev), all_b)
        states = {b: st[b][0].float().cpu() for b in all_b}
        data.heldout.append({"full": full, "p": len(q), "states": states})
    import transformers

    data.engine = {"name": "hf-transformers", "version": transformers.__version__}
    data.seconds = round(time.time() - t0, 2)
    return data


def _train_item(sid, ids, mask, aux, final) -> dict:
    return {
        "sample_id": int(sid),
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "loss_mask": torch.tensor(mask, dtype=torch.uint8),
        "aux": aux,
        "final": final,
    }


def capture_vllm(client, src: Source, train_samples, prompts, bnds, all_b, n_gen) -> SourceData:
    """vLLM capture of one source through its own forward (``client``: a started vLLM
    :class:`eagle3nb.engines.client.EngineClient` on the source's model folder and dtype): its
    plain greedy continuations (unstopped), then one capture call over the train samples and the
    held-out prompt + continuation sequences (vLLM id = boundary; id N = boundary N).

    Raises:
        ValueError: vLLM returned rows of another width than the boundaries asked.
    """
    t0 = time.time()
    info = client.info()
    gens = client.generate(prompts, n_gen, [], 0.0, 1.0, 0)  # ignore_eos: exactly n_gen tokens
    fulls = [list(q) + list(g) for q, g in zip(prompts, gens)]
    ids = sorted(set(all_b) | set(bnds))
    rows = client.capture([s[1] for s in train_samples] + fulls, ids)
    H = rows[0]["final"].shape[-1]
    if rows[0]["aux"].shape[-1] != len(ids) * H:
        raise ValueError(f"vLLM gave aux width {rows[0]['aux'].shape[-1]}, expected {len(ids)}x{H}")
    data = SourceData(src)
    for (sid, tok, mask), r in zip(train_samples, rows):
        per = _split(r["aux"], ids, H)
        aux = torch.cat([per[b] for b in bnds], dim=-1)
        data.train.append(_train_item(sid, tok, mask, aux, r["final"].float()))
    for q, full, r in zip(prompts, fulls, rows[len(train_samples) :]):
        per = _split(r["aux"], ids, H)
        data.heldout.append(
            {"full": torch.tensor(full), "p": len(q), "states": {b: per[b] for b in all_b}}
        )
    data.engine = {
        "name": info["engine_name"],
        "version": info["engine_version"],
        "device": info["device"],
        "linear_kernels": linear_kernels(client.log_path),
    }
    data.seconds = round(time.time() - t0, 2)
    return data


def _split(aux: torch.Tensor, ids: list[int], H: int) -> dict[int, torch.Tensor]:
    a = aux.float()
    return {b: a[:, i * H : (i + 1) * H] for i, b in enumerate(ids)}


def linear_kernels(log_path) -> list[str]:
    """vLLM's own lines naming the linear kernels it picked (``Using CPUWNA16LinearKernel for
    CompressedTensorsWNA16``, ``Selected ... Int8ScaledMM...``), read from the worker's log."""
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return []
    found = re.findall(r"(?:Using|Selected|Selecting)\s+\w*Kernel\w*[^\n]*", text)
    return sorted({re.sub(r"\s+", " ", f).strip()[:160] for f in found})


def drift_stats(ref: SourceData, other: SourceData, bnds, head, top: int = 5) -> dict:
    """``other``'s states and logits on the train samples against the reference's (same tokens).

    Args:
        head: ``final [T, H] -> logits [T, V]`` in float32 (the target's final norm + lm_head:
            never quantized, so it gives each source's logits from its own boundary N).

    Returns:
        ``{"boundaries": {str(b): {"relative_error" (median over tokens of |x - ref| / |ref|),
        "cosine" (mean), "top_channels" [(channel, share of the squared error)]}}, "logits":
        {"relative_error" (|l - ref| / |ref| over all), "max_abs", "top1_agreement"}}``.
    """
    H = ref.train[0]["final"].shape[-1]
    a = torch.cat([x["aux"] for x in ref.train])
    o = torch.cat([x["aux"] for x in other.train])
    out = {"boundaries": {}}
    for i, b in enumerate(list(bnds) + ["final"]):
        if b == "final":
            r = torch.cat([x["final"] for x in ref.train])
            x = torch.cat([x["final"] for x in other.train])
        else:
            r, x = a[:, i * H : (i + 1) * H], o[:, i * H : (i + 1) * H]
        d = x - r
        rel = (d.norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-12)).median()
        cos = torch.nn.functional.cosine_similarity(x, r, dim=-1).mean()
        sq = d.pow(2).sum(0)
        share = sq / sq.sum().clamp_min(1e-30)
        idx = share.argsort(descending=True)[:top].tolist()
        out["boundaries"][str(b)] = {
            "relative_error": round(float(rel), 6),
            "cosine": round(float(cos), 6),
            "top_channels": [[int(c), round(float(share[c]), 4)] for c in idx],
        }
    with torch.no_grad():
        lr = head(torch.cat([x["final"] for x in ref.train]))
        lo = head(torch.cat([x["final"] for x in other.train]))
    out["logits"] = {
        "relative_error": round(float((lo - lr).norm() / lr.norm()), 6),
        "max_abs": round(float((lo - lr).abs().max()), 5),
        "top1_agreement": round(float((lo.argmax(-1) == lr.argmax(-1)).float().mean()), 4),
    }
    return out


def figure_states(data: dict, bnds) -> dict[str, dict[int, torch.Tensor]]:
    """``{label: {b: [sum T, H]}}`` of every source's train states (same tokens), for
    :func:`eagle3nb.viz.plots.engine_drift_figure`; the reference first."""
    out = {}
    for d in data.values():
        a = torch.cat([x["aux"] for x in d.train])
        H = a.shape[1] // len(bnds)
        out[d.source.label] = {b: a[:, i * H : (i + 1) * H] for i, b in enumerate(bnds)}
    return out
