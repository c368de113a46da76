"""Checks of the paths a run reads (prompts file, chat dataset, chat template), before any work."""

from __future__ import annotations

from eagle3nb.repo_paths import resolve_path
from eagle3nb.text.conversations import looks_like_dataset


BUILTIN_PREFIX = "builtin:"


def eval_dataset_path(value: str):
    """The file ``eval_dataset`` names: ``builtin:NAME`` is ``eagle3nb/data/bench_NAME.jsonl`` (the
    sets shipped with the package), anything else a path (relative to the repository root).

    Raises:
        ValueError: the file does not exist (names the shipped sets).
    """
    from pathlib import Path

    data = Path(__file__).resolve().parent.parent / "data"
    if value.startswith(BUILTIN_PREFIX):
        f = data / f"bench_{value[len(BUILTIN_PREFIX) :]}.jsonl"
    else:
        f = resolve_path(value)
    if not f.is_file():
        shipped = sorted(
            BUILTIN_PREFIX + x.stem[len("bench_") :] for x in data.glob("bench_*.jsonl")
        )
        raise ValueError(
            f"eval_dataset={value!r} is not a file (looked at {f}); give a benchmark JSONL "
            f"(MT-Bench question.jsonl, GSM8K/HumanEval/MATH style, a chat dataset), one of the "
            f"shipped sets {shipped}, or null"
        )
    return f


def check_paths(p) -> None:
    """Refuse a missing prompts file, a dataset given as a prompts file, a missing dataset or one
    outside chat mode, and a chat template that is not a file or set in completion mode.

    Raises:
        ValueError: naming the parameter, its value and the fix.
    """
    pf = resolve_path(p.prompts_file)
    if not pf.is_file():
        raise ValueError(
            f"prompts_file={p.prompts_file!r} does not exist (looked at {pf}); point it at a text file with one prompt per line"
        )
    why = looks_like_dataset(pf)
    if why:
        raise ValueError(
            f"prompts_file={p.prompts_file!r} is not a file of prompts ({why}); give a chat dataset as dataset: {p.prompts_file} (with mode: chat), or a text file with one prompt per line"
        )
    if p.dataset is not None:
        if not resolve_path(p.dataset).exists():
            raise ValueError(
                f"dataset={p.dataset!r} does not exist (looked at {resolve_path(p.dataset)}); give a JSONL/JSON/Parquet file or a datasets folder, or null"
            )
        if p.mode != "chat":
            raise ValueError(
                f"dataset={p.dataset!r} needs mode: chat (conversations are rendered by a chat template); set mode: chat, or dataset: null"
            )
    if p.eval_dataset is not None:
        eval_dataset_path(p.eval_dataset)
    if p.mode == "completion" and p.chat_template is not None:
        raise ValueError(
            f"chat_template={p.chat_template!r} is set but mode='completion'; set mode: chat or chat_template: null"
        )
    if p.chat_template is not None and not resolve_path(p.chat_template).is_file():
        raise ValueError(
            f"chat_template={p.chat_template!r} is not a file; give a jinja template file or null for the tokenizer's own"
        )
