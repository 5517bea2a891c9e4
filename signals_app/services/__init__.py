"""Writes of the signal pipeline: ingest.py (receipt), processing.py (the gate's home), sweep.py."""
