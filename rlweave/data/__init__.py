"""Data: where training data comes from, apart from the envs.

* :mod:`rlweave.data.replay`: n-step transition writing and the replay buffer (one ring per source).
* :mod:`rlweave.data.datasets`: offline datasets in the Minari format (written from a run's policy,
  read as replay transitions).
* :mod:`rlweave.data.sft_data`: supervised fine-tuning rows for language models (padded or packed).
* :mod:`rlweave.data.experts`: imitation experts that label states with actions, and the gates
  that decide which steps they take over.

Modules import their optional dependencies (Minari) only when used.
"""
