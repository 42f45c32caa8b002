"""Throughput and memory of one part at a time."""
