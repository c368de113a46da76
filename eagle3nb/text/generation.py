"""Regenerate continuations with the target (the drafter learns what the target actually says).

Writes JSONL, one record per prompt: ``{"id", "prompt", "prompt_ids", "output_ids", "text"}``.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import torch

from eagle3nb.target.models import as_stop_list

__all__ = ["generate_batch", "generation_attention", "write_jsonl", "read_jsonl"]


def generation_attention(model) -> str:
    """The attention implementation :func:`generate_batch` decodes ``model`` with: ``sdpa``
    (PyTorch's fused scaled-dot-product attention) where the model class supports it, else the
    one the model was loaded with. The targets load with eager attention (the capture and the
    acceptance simulator's reference); for generation sdpa gave 01 the same tokens on the embedded
    default (every record of the main job's 106,272 tokens, greedy and sampled) at about twice
    the speed."""
    current = model.config._attn_implementation
    return "sdpa" if current == "eager" and getattr(model, "_supports_sdpa", False) else current


@contextmanager
def _attention(model, impl: str):
    """Decode with ``impl``, then give the caller its model back as it was."""
    before = model.config._attn_implementation
    if impl != before:
        model.set_attn_implementation(impl)
    try:
        yield
    finally:
        if impl != before:
            model.set_attn_implementation(before)


@torch.no_grad()
def generate_batch(
    model,
    prompt_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_id: int | list[int] | None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    pad_token_id: int | None = None,
) -> list[list[int]]:
    """Continuations of a batch of prompts (left padding, HF ``generate``, with the attention of
    :func:`generation_attention`; the model is handed back with its own).

    Args:
        prompt_ids: ragged token id lists (with BOS / template applied), each non-empty.
        temperature: 0 = greedy; > 0 samples with ``top_p``.
        pad_token_id: id written into the left padding (masked out, so it does not change the
            output); None = ``eos_token_id``, or 0 when that is None too.

    Returns:
        One list of new token ids per prompt, cut after the first EOS (EOS kept: the drafter must
        learn to predict it too). An empty ``prompt_ids`` gives ``[]``.

    Raises:
        ValueError: ``max_new_tokens`` < 1, ``temperature`` < 0 or ``top_p`` outside (0, 1], an empty
            prompt, or a prompt whose length + ``max_new_tokens`` exceeds the model's context
            (``config.max_position_embeddings``).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(
            f"temperature={temperature}, top_p={top_p}: need temperature >= 0 and 0 < top_p <= 1"
        )
    if len(prompt_ids) == 0:
        return []
    ctx = getattr(model.config, "max_position_embeddings", None)
    for i, p in enumerate(prompt_ids):
        if len(p) == 0:
            raise ValueError(f"prompt_ids[{i}] is empty; a prompt needs at least one token (BOS)")
        if ctx is not None and len(p) + max_new_tokens > ctx:
            raise ValueError(
                f"prompt_ids[{i}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} it exceeds the context of {ctx}; shorten it or lower max_new_tokens"
            )
    stops = as_stop_list(eos_token_id)
    pad = pad_token_id if pad_token_id is not None else (stops[0] if stops else 0)
    T = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), T), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompt_ids):
        ids[i, T - len(p) :] = torch.tensor(list(p))
        mask[i, T - len(p) :] = 1
    kw = (
        dict(do_sample=False)
        if temperature == 0
        else dict(do_sample=True, temperature=temperature, top_p=top_p)
    )
    torch.manual_seed(seed)
    dev = next(model.parameters()).device
    with _attention(model, generation_attention(model)):
        out = model.generate(
            ids.to(dev),
            attention_mask=mask.to(dev),
            max_new_tokens=max_new_tokens,
            eos_token_id=stops or None,
            pad_token_id=pad,
            **kw,
        )
    res = []
    for row in out[:, T:].cpu().tolist():
        cut = [row.index(e) for e in stops if e in row]
        if cut:
            row = row[: min(cut) + 1]
        res.append(row)
    return res


def write_jsonl(path: str | Path, records: list[dict]) -> None:
    """Write records atomically (temp file, then rename)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: str | Path) -> list[dict]:
    """Read JSONL records. Raises FileNotFoundError naming the file and the step that writes it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run notebooks/01_generate for this run first")
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
