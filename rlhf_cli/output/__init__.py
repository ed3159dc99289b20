"""The output directory's contract: its file names (run_dir), its small files (files), checkpoints and ownership."""
