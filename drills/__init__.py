"""Reliability drills: a real deployment on loopback, driven over HTTP, with faults injected."""
