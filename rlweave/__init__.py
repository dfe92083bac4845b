"""rlweave: RL post-training for embodied and agentic AI on Ray."""
__version__ = "0.1.0"
