"""Where each engine reads and writes its layer ids in a drafter ``config.json``: the one module that
names the key ``eagle_aux_hidden_state_layer_ids`` (the engine side of ``engines/``, which runs in
the engine's own venv and may not import eagle3nb.boundaries, spells it itself).

- SGLang 0.5.x reads only the nested ``eagle_config.eagle_aux_hidden_state_layer_ids``
  (``srt/models/llama_eagle3.py``; ``../shared/reference/conventions.md`` section 2).
- vLLM 0.3x reads the top-level key; when that is absent or empty, DFlash's
  ``dflash_config.target_layer_ids`` + 1, then (overriding it) the nested
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` when ``eagle_config`` is a dict (0.32.0
  ``v1/worker/gpu_model_runner.py:5251-5285`` ``_get_eagle3_aux_layers_from_config``).
"""

from __future__ import annotations

__all__ = [
    "IDS_KEY", "IDS_PATH", "get_ids", "set_ids", "mark_ids", "pop_ids", "vllm_ids", "written_ids",
]  # fmt: skip

IDS_KEY = "eagle_aux_hidden_state_layer_ids"
# engine -> where it reads its ids (dotted for the nested key)
IDS_PATH = {"sglang": f"eagle_config.{IDS_KEY}", "vllm": IDS_KEY}


def _check(engine: str) -> None:
    if engine not in IDS_PATH:
        raise ValueError(f"engine={engine!r}: known engines are {sorted(IDS_PATH)}")


def get_ids(cfg: dict, engine: str) -> list | None:
    """The ids stored at ``engine``'s own key of ``cfg`` (:data:`IDS_PATH`; vLLM's fallbacks are
    :func:`vllm_ids`), or None where the key is absent or not a dict path.

    Raises:
        ValueError: unknown engine.
    """
    _check(engine)
    if engine == "sglang":
        ec = cfg.get("eagle_config")
        return ec.get(IDS_KEY) if isinstance(ec, dict) else None
    return cfg.get(IDS_KEY)


def set_ids(cfg: dict, engine: str, ids) -> None:
    """Write ``ids`` (a list of ints) at ``engine``'s key of ``cfg``, in place (SGLang's nested
    ``eagle_config`` is created when absent).

    Raises:
        ValueError: unknown engine.
    """
    _check(engine)
    ids = [int(i) for i in ids]
    if engine == "sglang":
        cfg.setdefault("eagle_config", {})[IDS_KEY] = ids
    else:
        cfg[IDS_KEY] = ids


def mark_ids(cfg: dict, engine: str, text: str) -> None:
    """Write ``[1, text]`` at ``engine``'s key of ``cfg``, in place: the refusal mark of
    :func:`eagle3nb.boundaries.refusal.refuse_engine` (why 1 and a string: its module docstring).

    Raises:
        ValueError: unknown engine.
    """
    _check(engine)
    mark = [1, str(text)]
    if engine == "sglang":
        cfg.setdefault("eagle_config", {})[IDS_KEY] = mark
    else:
        cfg[IDS_KEY] = mark


def pop_ids(cfg: dict, engine: str) -> None:
    """Remove ``engine``'s ids from ``cfg`` in place (an export that refuses the engine)."""
    _check(engine)
    holder = cfg.get("eagle_config") if engine == "sglang" else cfg
    if isinstance(holder, dict):
        holder.pop(IDS_KEY, None)


def written_ids(cfg: dict) -> dict:
    """``{engine: ids}`` for the engines whose own key holds non-empty ids."""
    return {e: get_ids(cfg, e) for e in IDS_PATH if get_ids(cfg, e)}


def vllm_ids(cfg: dict) -> tuple[list[int] | None, str]:
    """The ids vLLM 0.32.0 reads from a drafter config and where from, mirroring
    ``v1/worker/gpu_model_runner.py:5251-5285`` (a falsy value counts as absent there):
    ``(ids, "config" | "config (dflash_config...)" | "config (nested eagle_config...)")``, or
    ``(None, "engine default")``."""
    ids, src = cfg.get(IDS_KEY), "config"
    if not ids:
        dflash, eagle = cfg.get("dflash_config"), cfg.get("eagle_config")
        if dflash and isinstance(dflash, dict):
            ids = [i + 1 for i in (dflash.get("target_layer_ids") or [])]
            src = "config (dflash_config.target_layer_ids + 1)"
        if eagle and isinstance(eagle, dict):
            ids = eagle.get(IDS_KEY)
            src = "config (nested eagle_config: no top-level key)"
    if ids and isinstance(ids, (list, tuple)):
        return list(ids), src
    return None, "engine default"
