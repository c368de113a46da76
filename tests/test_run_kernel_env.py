"""The notebook kernels of a headless run import the eagle3nb that runs them (eagle3nb.run.kernel_env):
this checkout's root leads their PYTHONPATH and the runner's relative entries are made absolute
against its working directory (the kernels run in notebooks/, where ``.`` is another folder)."""

import os

from eagle3nb import run
from eagle3nb.repo_paths import REPO_ROOT


def test_kernel_pythonpath_leads_with_this_checkout_and_is_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([".", "lib", str(REPO_ROOT)]))
    env = run.kernel_env()
    assert env["PYTHONPATH"].split(os.pathsep) == [
        str(REPO_ROOT), str(tmp_path.resolve()), str((tmp_path / "lib").resolve())
    ]  # fmt: skip
    assert env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    monkeypatch.delenv("PYTHONPATH")
    assert run.kernel_env()["PYTHONPATH"] == str(REPO_ROOT)
