"""Rewards: verifiers that score answers against references, LLM judges, and per-role reward assignment."""

from workbench.rewards.judge import JUDGE_PROMPTS, Judgement, JudgePrompt, LLMJudge
from workbench.rewards.verifiers import VERIFIERS, register, verify

__all__ = ["JUDGE_PROMPTS", "VERIFIERS", "JudgePrompt", "Judgement", "LLMJudge", "register", "verify"]
