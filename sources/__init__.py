"""spark-eos sources."""
