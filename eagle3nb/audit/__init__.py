"""The audit of a drafter trained elsewhere (issue 34): the boundaries it was trained on, the ones
each engine will feed it, and a corrected copy (:func:`eagle3nb.audit.core.run_audit`; the command
line is ``python -m eagle3nb.audit``, the notebook ``06_audit``)."""
