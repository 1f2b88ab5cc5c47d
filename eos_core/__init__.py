"""What the connectors (``sources/``, ``sinks/``) import of ``connectors``: errors, option specs,
connection-string handling, fault points, checkpoint reading, Spark's task context (spark_task) and a
bounded wait for client calls that may outwait their own timeout (waits). It imports nothing else of ours."""
