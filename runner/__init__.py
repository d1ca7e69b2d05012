"""Findings + pillars → test plan → results: selection, local executor, Actions dispatch, the GPU-side entry point."""
