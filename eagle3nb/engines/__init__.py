"""Real inference engines (vLLM, SGLang) behind one interface, across a process boundary.

Kept free of heavy imports: the engine worker imports ``eagle3nb.engines.*`` with the engine's own
virtual environment (another torch build), so nothing here may import torch, transformers or the
rest of ``eagle3nb``. See :mod:`eagle3nb.engines.worker` and :mod:`eagle3nb.engines.client`.
"""
