"""fourfold.data."""
