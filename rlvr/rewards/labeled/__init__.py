"""Labeled data for the verifier: equivalence pairs (JSONL) and hostile inputs."""
