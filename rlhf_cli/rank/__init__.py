"""Code that runs inside each launched rank: builds the trainer from the resolved recipe and trains."""
