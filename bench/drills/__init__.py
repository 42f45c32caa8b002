"""Faults on purpose: kills, an elastic fleet, protocol fuzzing, hostile verifier inputs."""
