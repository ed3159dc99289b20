"""Model configs without weights: config.json from a directory or the hub cache (hub), and its modules
(architectures)."""
