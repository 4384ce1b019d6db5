"""Helpers for the integration tests: directory trees, snapshots, subprocess drivers."""
