"""How a run generates (HF from the shards, gathered, a budget, or an engine) and how it syncs; a leaf every layer
reads."""
