"""What the steps share: run-folder inputs, checks written once, metrics.json helpers, and
results recorded in the run folder."""
