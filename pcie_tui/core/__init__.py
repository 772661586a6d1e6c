"""The base layer: samples and the session header, the per-GPU metrics table, the link ceiling, the vocabulary, units, errors, file formats."""
