"""fourfold.rollout."""
