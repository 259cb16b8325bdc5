"""Data and rewards: problem sources (files, hub, reasoning-gym), row formats, prompts, reward
functions, GSM8K answer parsing, the code sandbox, and user plugins (module:function)."""
