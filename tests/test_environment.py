"""environment.yml (conda users) and the pip install CI uses list the same packages."""

import re
import tomllib

import yaml

from eagle3nb.repo_paths import REPO_ROOT


def names(reqs):
    return {
        re.split(r"[<>=!~\[ ]", r.strip(), maxsplit=1)[0].lower()
        for r in reqs
        if r.strip() and not r.startswith("-")
    }


def test_environment_yml_matches_pyproject():
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    proj = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    ci = proj["dependencies"] + proj["optional-dependencies"]["dev"]
    assert names(pip) == names(ci)
    assert (
        "torch==2.13.0" in pip and "torch==2.13.0" in (REPO_ROOT / ".ci" / "setup.sh").read_text()
    )
