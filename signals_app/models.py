# Signals, aggregates and the processing pipeline arrive with the signal pipeline issue.
