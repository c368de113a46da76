"""One module per notebook: what 01-04 do, called from their cells and from ``eagle3nb.run``."""
