"""06_audit: the prompts the audit measures on (the audit itself: :mod:`eagle3nb.audit`)."""
