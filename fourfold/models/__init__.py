"""fourfold.models."""
