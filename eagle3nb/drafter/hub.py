"""Publish an exported drafter folder to the Hugging Face Hub through ``huggingface_hub``.

:func:`upload_drafter` builds one commit (``CommitOperationAdd`` per file, what
``HfApi.upload_folder`` builds) and, unless ``dry_run``, sends it with ``HfApi.create_commit``
(a pull request by default). The token comes from the argument, ``HF_TOKEN`` or the
``huggingface_hub`` login, is never written anywhere, and a real upload refuses to start without
one. The folder is checked first (:func:`eagle3nb.drafter.export.load_drafter`) and must carry its
model card (``README.md``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["build_operations", "upload_drafter"]

UPLOADED = ["config.json", "model.safetensors", "README.md", "manifest.json"]


def build_operations(folder, verifier_name_or_path: str | None = None) -> list:
    """``CommitOperationAdd`` for each file of the drafter folder (``UPLOADED`` that exist).

    ``verifier_name_or_path``: written into the uploaded config.json's
    ``speculators_config.verifier.name_or_path`` (the target's Hub id; the local folder's file is
    left as it is).

    Raises:
        FileNotFoundError: config.json, model.safetensors or README.md missing.
        ValueError: the folder does not load as a drafter (see ``load_drafter``).
    """
    from huggingface_hub import CommitOperationAdd

    from eagle3nb.drafter.export import load_drafter

    folder = Path(folder)
    for f in UPLOADED[:3]:
        if not (folder / f).is_file():
            raise FileNotFoundError(
                f"{folder / f} missing; export the drafter (03) and write its card (04) first"
            )
    load_drafter(folder)  # refuses missing tensors, contradicting shapes, bad d2t/t2d
    ops = []
    for f in UPLOADED:
        path = folder / f
        if not path.is_file():
            continue
        if f == "config.json" and verifier_name_or_path:
            cfg = json.loads(path.read_text())
            cfg.setdefault("speculators_config", {}).setdefault("verifier", {})
            cfg["speculators_config"]["verifier"]["name_or_path"] = verifier_name_or_path
            data = (json.dumps(cfg, indent=2) + "\n").encode()
            ops.append(CommitOperationAdd(path_in_repo=f, path_or_fileobj=data))
        else:
            ops.append(CommitOperationAdd(path_in_repo=f, path_or_fileobj=str(path)))
    return ops


def upload_drafter(
    folder,
    repo_id: str,
    token: str | None = None,
    create_pr: bool = True,
    dry_run: bool = True,
    private: bool = True,
    verifier_name_or_path: str | None = None,
    commit_message: str = "Upload EAGLE-3 drafter (eagle3nb)",
) -> dict:
    """Upload ``folder`` to the model repo ``repo_id`` (created if absent, private by default).

    Returns:
        ``{"repo_id", "operations": [path_in_repo], "create_pr", "dry_run", "commit_url"}``
        (``commit_url`` None in a dry run, which sends nothing).

    Raises:
        PermissionError: not a dry run and no token (argument, ``HF_TOKEN`` or a saved login).
        FileNotFoundError / ValueError: see :func:`build_operations`.
    """
    ops = build_operations(folder, verifier_name_or_path)
    out = {
        "repo_id": repo_id,
        "operations": [op.path_in_repo for op in ops],
        "create_pr": create_pr,
        "dry_run": dry_run,
        "commit_url": None,
    }
    if dry_run:
        return out
    from huggingface_hub import HfApi, get_token

    token = token or os.environ.get("HF_TOKEN") or get_token()
    if not token:
        raise PermissionError(
            "no Hugging Face token: pass token=..., set HF_TOKEN, or `hf auth login`; "
            "dry_run=True shows the commit without one"
        )
    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    info = api.create_commit(
        repo_id, ops, commit_message=commit_message, create_pr=create_pr, repo_type="model"
    )
    out["commit_url"] = getattr(info, "pr_url", None) or getattr(info, "commit_url", None)
    return out
