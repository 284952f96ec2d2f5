"""Agents: PPO (feed-forward or recurrent) in compile-once segments."""
