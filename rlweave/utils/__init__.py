"""Run outputs shared by every runner: metrics, traces, progress, checkpoints."""
