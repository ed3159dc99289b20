"""The command-line layer: parses flags, calls the config and launch layers, prints."""
