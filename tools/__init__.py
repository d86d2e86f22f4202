"""Operator tools: synth summary, pipeline CLI, cost report."""
