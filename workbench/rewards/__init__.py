"""Rewards: verifiers that score answers against references (reward assignment schemes come next)."""

from workbench.rewards.verifiers import VERIFIERS, register, verify

__all__ = ["VERIFIERS", "register", "verify"]
