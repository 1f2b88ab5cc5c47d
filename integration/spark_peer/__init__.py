"""The differential suite: Spark's own ``format("kafka")`` beside kafka-eos, in the peer environment (``make test-spark-peer``)."""
