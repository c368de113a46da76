"""Offline install of a GPU engine (vLLM) for a host with no package index: a bundle of parts
built here, unpacked there by one script (python -m eagle3nb.offline build / check)."""
