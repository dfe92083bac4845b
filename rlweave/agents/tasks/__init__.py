"""Agent tasks: text tasks whose prompts expect tools (``calc``: calculator; ``multihop``: search over
a generated corpus), each with a scripted expert for SFT traces. Registered in the task registry of
:mod:`rlweave.envs.text_tasks` by import path, so ``make_task({"name": "calc"})`` loads them."""

from rlweave.agents.tasks.base import AgentTask, ExpertCall, ExpertMiss
from rlweave.agents.tasks.prompts import final_answer, initial_messages, system_prompt

__all__ = ["AgentTask", "ExpertCall", "ExpertMiss", "final_answer", "initial_messages", "system_prompt"]
