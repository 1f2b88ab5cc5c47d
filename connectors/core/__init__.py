"""What the connectors (``sources/``, ``sinks/``) import of ``connectors``: errors, option specs,
connection-string handling, fault points and checkpoint reading. It imports nothing else of ours."""
