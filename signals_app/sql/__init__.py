"""The pipeline's set-based writes: common.py (what they share), ingest.py, credit.py, take_back.py."""
