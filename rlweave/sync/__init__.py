"""Weight sync between worker groups: the actor's weights as bucketed, versioned, checksummed
packets (:mod:`rlweave.sync.weights`) that rollout workers and generation engines load and verify.

A runtime concern between the model layer (state dicts, checksums) and the workers that send and
receive: it packs models and moves the packets through Ray's object store.
"""
