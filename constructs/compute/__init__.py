"""Compute backends: the seam the pipeline and observability stacks see (backend.py), then one folder per backend."""
