"""Benchmarks of spark-eos: each prints a table of ratios against a peer or a limit measured in the same run."""
