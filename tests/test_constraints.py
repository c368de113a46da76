"""The pinned versions (.ci/constraints*.txt, issue 32 item 6): every install path passes them to
pip, the running environment is the one they describe (read from the installed distributions, not
from the file), and docs/development.md names the transformers that is really installed."""

import re
from importlib import metadata

import transformers
import yaml

from eagle3nb.repo_paths import REPO_ROOT

CI = REPO_ROOT / ".ci"


def _pins(path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, ver = line.partition("==")
            assert ver, f"{path.name}: {line!r} is not name==version"
            out[re.sub(r"[-_.]+", "-", name.lower())] = ver.strip()
    return out


def test_the_environment_is_the_one_the_constraints_pin():
    pins = _pins(CI / "constraints.txt")
    assert {"torch", "transformers", "compressed-tensors", "safetensors", "datasets"} <= set(pins)
    installed = {
        re.sub(r"[-_.]+", "-", d.metadata["Name"].lower()): d.version.split("+")[0]
        for d in metadata.distributions()
    }
    differ = {k: (v, installed.get(k)) for k, v in pins.items() if installed.get(k) != v}
    assert not differ, f"installed != .ci/constraints.txt (pin, installed): {differ}"


def test_every_install_passes_its_constraints():
    setup = (CI / "setup.sh").read_text()
    installs = [
        ln for ln in setup.splitlines() if "pip install" in ln and "--upgrade pip" not in ln
    ]
    assert len(installs) == 2 and all('-c "$C"' in ln for ln in installs)
    assert "C=.ci/constraints.txt" in setup
    engines = (CI / "setup_engines.sh").read_text()
    for eng, var in (("vllm", "VLLM"), ("sglang", "SGL")):
        lines = [ln for ln in engines.splitlines() if f'"${var}/bin/pip" install -q ' in ln]
        lines = [ln for ln in lines if "--upgrade pip" not in ln]
        assert lines and all(f'-c "$CI/constraints-{eng}.txt"' in ln for ln in lines), eng
        assert _pins(CI / f"constraints-{eng}.txt")["transformers"]
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-c .ci/constraints.txt" in pip


def test_docs_name_the_installed_transformers():
    page = (REPO_ROOT / "docs" / "development.md").read_text()
    setup_par = page.split("**Pinned versions.**")[1].split("\n\n")[0]
    assert f"transformers {transformers.__version__}" in setup_par
    assert _pins(CI / "constraints.txt")["transformers"] == transformers.__version__
