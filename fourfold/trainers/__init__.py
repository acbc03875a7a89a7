"""fourfold.trainers."""
