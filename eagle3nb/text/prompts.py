"""Prompt files and the deterministic train / held-out split."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["DEFAULT_PROMPTS", "load_prompts", "split_prompts"]

DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "prompts_tinystories.txt"


def load_prompts(path: str | Path = DEFAULT_PROMPTS) -> list[str]:
    """Prompts from a text file, one per line; blank lines and lines starting with ``#`` are skipped.

    Raises:
        FileNotFoundError: ``path`` does not exist. ValueError: no prompt or a duplicate prompt.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"prompts_file={str(p)!r} does not exist; point it at a text file with one prompt per line"
        )
    out = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
    out = [ln for ln in out if ln and not ln.startswith("#")]
    if not out:
        raise ValueError(f"prompts_file={str(p)!r} holds no prompt; add at least one line of text")
    dup = {x for x in out if out.count(x) > 1}
    if dup:
        raise ValueError(
            f"prompts_file={str(p)!r} repeats {len(dup)} prompt(s), e.g. {sorted(dup)[0]!r}; remove duplicates"
        )
    return out


def split_prompts(
    prompts: list[str], heldout_fraction: float, seed: int = 0
) -> tuple[list[str], list[str]]:
    """Deterministic split: a prompt is held out when sha256(seed, prompt) falls below the fraction.

    Depends only on each prompt's text and the seed (not on file order), so adding prompts never
    moves an existing one between sets.

    Returns:
        ``(train, heldout)`` in file order.

    Raises:
        ValueError: ``heldout_fraction`` outside (0, 1).
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction={heldout_fraction}: must be in (0, 1), e.g. 0.15")
    train, held = [], []
    for p in prompts:
        h = int.from_bytes(hashlib.sha256(f"{seed}\x00{p}".encode()).digest()[:8], "big") / 2**64
        (held if h < heldout_fraction else train).append(p)
    return train, held
