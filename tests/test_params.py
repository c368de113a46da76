"""eagle3nb.params: the shipped params files validate; bad keys and values name the key, the value and
the fix; the device parameter."""

import pytest

from eagle3nb.repo_paths import REPO_ROOT
from eagle3nb.params import load_params


def test_shipped_params_files_validate():
    for f in (REPO_ROOT / "params").glob("*.yaml"):
        load_params(f)


@pytest.mark.parametrize(
    "text, msg",
    [
        ("max_step: 10\n", "max_step=10: unknown key; did you mean 'max_steps'"),
        ("k: 0\n", "k=0"),
        ("layer_ids: [3, 1, 2]\n", "strictly increasing"),
        ("prompts_file: nowhere.txt\n", "prompts_file='nowhere.txt' does not exist"),
        ("convention: tensorrt\n", "convention='tensorrt' is unknown"),
        ("batch_size: many\n", "batch_size='many'"),
    ],
)
def test_bad_params_name_key_value_and_fix(tmp_path, text, msg):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=msg):
        load_params(f)


def test_device_parameter():
    import torch

    from eagle3nb.params import RunParams, resolve_device

    assert resolve_device(RunParams(device="cpu")) == "cpu"
    assert resolve_device(RunParams(device="auto")) == (
        "cuda" if torch.cuda.is_available() else "cpu"
    )
    with pytest.raises(ValueError, match="device"):
        RunParams(device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no GPU"):
            resolve_device(RunParams(device="cuda"))


def test_error_for_a_list_field_names_its_real_default(tmp_path):
    """A field with a default factory shows that default (not pydantic's 'PydanticUndefined')."""
    f = tmp_path / "p.yaml"
    f.write_text("generate_speed_engines: null\n")
    with pytest.raises(ValueError) as e:
        load_params(f, interactive=False)
    assert "generate_speed_engines: [] (the default)" in str(e.value)
    assert "PydanticUndefined" not in str(e.value)


def test_smoke_params_are_the_stored_notebooks_defaults():
    """params/smoke.yaml is the run the stored notebooks make (their parameters cells hold the
    RunParams defaults), so the session's headless smoke run and the JupyterLab/nbval runs of the
    stored notebooks are one run (tests/conftest.py ``smoke_run``)."""
    from eagle3nb.params import RunParams, load_params
    from eagle3nb.repo_paths import REPO_ROOT

    smoke = load_params(REPO_ROOT / "params" / "smoke.yaml")
    assert smoke.model_dump() == RunParams().model_dump()


def test_set_errors_name_the_command_line_not_the_file(tmp_path):
    """Issue 43 item 7: a bad value given by --set is attributed to --set; a file holding bad
    values too gets each line tagged with where it came from."""
    from eagle3nb.params import parse_sets

    f = tmp_path / "p.yaml"
    f.write_text("max_steps: 10\n")
    with pytest.raises(ValueError) as e:
        load_params(f, **parse_sets(["max_stepz=5"]))
    assert str(e.value) == (
        f"invalid parameters in --set (over {f}):\n  max_stepz=5: unknown key; did you mean "
        "'max_steps'? (all keys with their help: the parameters cells of notebooks/*.ipynb, or "
        "eagle3nb/params/schema.py RunParams)"
    )
    f.write_text("k: 0\n")
    with pytest.raises(ValueError) as e:
        load_params(f, **parse_sets(["max_steps=-1"]))
    lines = str(e.value).splitlines()
    assert lines[0] == f"invalid parameters in {f} and --set:"
    assert sorted(x.split(":")[0] for x in lines[1:]) == [
        f"  k=0 ({f})",
        "  max_steps=-1 (--set)",
    ]
