"""What the connectors (``sources/``, ``sinks/``) import of ``connectors``: errors, option specs,
connection-string handling, fault points, checkpoint reading and Spark's task context (spark_task). It
imports nothing else of ours."""
