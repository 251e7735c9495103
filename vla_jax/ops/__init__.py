"""Recurrences (sequence mixers' cores): VLA and its baselines, each in several forms."""
