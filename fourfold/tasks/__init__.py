"""fourfold.tasks."""
