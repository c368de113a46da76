"""Shared fixtures: the real tiny target (stories260K-hd32) loaded once per session."""

import pytest
import torch

from eagle3nb.target import models


@pytest.fixture(scope="session")
def target():
    torch.manual_seed(0)
    model, tok, path = models.load_target("stories260K-hd32")
    return model, tok, path


@pytest.fixture(scope="session")
def tiny_ds(target, tmp_path_factory):
    """The tiny HF-captured dataset (:func:`testkit.write_tiny_dataset`: five stories, SGLang ids
    [0, 1, 3], shards of 2), built once per session, as an in-memory AuxDataset."""
    from testkit import write_tiny_dataset

    from eagle3nb.dataset.read import AuxDataset

    return AuxDataset(write_tiny_dataset(target, tmp_path_factory.mktemp("tiny_ds")))
