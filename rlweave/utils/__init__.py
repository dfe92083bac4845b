"""Helpers below every layer: run outputs (metrics, traces, progress, checkpoints), observation
trees, and node-local direct calls between processes."""
