"""Reading and validating parameters: params YAML files, a notebook's parameters, the device.

Papermill only warns about unknown parameters; here an unknown key, a wrong type or an
out-of-range value fails before any work starts, naming the key, the value and the fix.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import yaml
from pydantic import ValidationError


from eagle3nb.params.schema import RENAMED, RunParams


_HINTS = {
    "rdzv_endpoint": "host:port of node 0, e.g. 10.0.0.1:29500",
    "run_name": "letters, digits, '.', '_' and '-' only (it names the folder outputs_dir/run_name)",
}


def _format_error(e: ValidationError, source: str, overrides=()) -> str:
    """The validation errors, one line each, under a header naming where the bad values came
    from: ``source`` (the file), ``--set`` (a key in ``overrides``, the command line's), or both
    (each line then says which)."""
    errs = e.errors()
    over = [bool(err["loc"]) and str(err["loc"][0]) in overrides for err in errs]
    mixed = any(over) and not all(over)
    where = f"--set (over {source})" if over and all(over) else source
    lines = [f"invalid parameters in {where + ' and --set' if mixed else where}:"]
    for err, is_set in zip(errs, over):
        key = ".".join(str(x) for x in err["loc"]) or "(file)"
        val = err.get("input")
        tag = (" (--set)" if is_set else f" ({source})") if mixed else ""
        if err["type"] == "value_error":  # our validators' messages already name key, value and fix
            lines.append(f"  {err['ctx']['error']}{tag}")
            continue
        if err["type"] == "extra_forbidden" and str(err["loc"][0]) in RENAMED:
            lines.append(f"  {key}={val!r}{tag}: renamed; write {RENAMED[str(err['loc'][0])]}")
            continue
        if err["type"] == "extra_forbidden":
            near = difflib.get_close_matches(str(err["loc"][0]), list(RunParams.model_fields), n=1)
            hint = (
                (f"unknown key; did you mean {near[0]!r}?" if near else "unknown key; remove it")
                + " (all keys with their help: the parameters cells of notebooks/*.ipynb, or eagle3nb/params/schema.py RunParams)"
            )
        else:
            hint = err["msg"]
            field = RunParams.model_fields.get(str(err["loc"][0])) if err["loc"] else None
            if str(err["loc"][0] if err["loc"] else "") in _HINTS:
                hint += "; use " + _HINTS[str(err["loc"][0])]
            elif field is not None and field.default_factory is not None:  # e.g. lists: []
                hint += f"; e.g. {key}: {field.default_factory()!r} (the default)"
            elif field is not None and field.default is not None:
                hint += f"; e.g. {key}: {field.default!r} (the default)"
        lines.append(f"  {key}={val!r}{tag}: {hint}")
    return "\n".join(lines)


def load_params(path: str | os.PathLike, **overrides) -> RunParams:
    """Read and validate a params YAML file (plus overrides, ``--set`` on the command line: an
    invalid one is named as coming from ``--set``, not from the file).

    Raises:
        FileNotFoundError: no such file. ValueError: any invalid key or value (all listed).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"params file {path} does not exist; see params/default.yaml")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"params file {path} must hold a mapping of key: value")
    data.update(overrides)
    try:
        return RunParams(**data)
    except ValidationError as e:
        raise ValueError(_format_error(e, str(path), set(overrides))) from None


def collect(namespace: dict) -> RunParams:
    """Validate the parameters a notebook declared (the RunParams fields found in ``namespace``,
    e.g. ``globals()``); fields it does not declare keep their defaults."""
    data = {k: namespace[k] for k in RunParams.model_fields if k in namespace}
    try:
        return RunParams(**data)
    except ValidationError as e:
        raise ValueError(_format_error(e, "the notebook's parameters")) from None


def resolve_device(p: RunParams) -> str:
    """``device`` as torch understands it: ``auto`` is ``cuda`` when a GPU is visible, else ``cpu``.

    Raises:
        ValueError: ``cuda`` asked for but torch sees no GPU.
    """
    import torch

    if p.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if p.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"device={p.device!r} but torch sees no GPU (torch {torch.__version__}); use device: cpu or auto"
        )
    return p.device


def load_run_params(run: str | os.PathLike, sets: list[str] | None) -> RunParams:
    """The params of a run folder (its params.yaml) or of a params YAML file, with ``--set
    key=value`` overrides (values parsed as YAML).

    Raises:
        FileNotFoundError: a folder without params.yaml.
        ValueError: an override without ``=``.
    """
    run = Path(run)
    pf = run / "params.yaml" if run.is_dir() else run
    if run.is_dir() and not pf.exists():
        raise FileNotFoundError(
            f"{run} is a folder without params.yaml; pass a run folder written by "
            "`python -m eagle3nb.run` or a params YAML file"
        )
    return load_params(pf, **parse_sets(sets))


def parse_sets(sets: list[str] | None) -> dict:
    """``--set key=value`` options as overrides ``{key: value}`` (values parsed as YAML, so
    ``--set layer_ids=[1,3,5]`` gives a list); the keys and values are validated by
    :func:`load_params` with the params file's own messages.

    Raises:
        ValueError: an option without ``=``.
    """
    over = {}
    for kv in sets or []:
        if "=" not in kv:
            raise ValueError(f"--set {kv!r}: write key=value, e.g. --set max_steps=200")
        k, v = kv.split("=", 1)
        over[k.strip()] = yaml.safe_load(v)
    return over


# --- the parameter surface: notebooks' parameters cells and docs/parameters.md, rendered from RunParams
