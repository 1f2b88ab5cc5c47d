"""spark-eos sinks."""
