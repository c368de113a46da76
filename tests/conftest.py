"""Shared fixtures: the real tiny target (stories260K-hd32) loaded once per session."""

import pytest
import torch

from eagle3nb.target import models


@pytest.fixture(scope="session")
def target():
    torch.manual_seed(0)
    model, tok, path = models.load_target("stories260K-hd32")
    return model, tok, path
