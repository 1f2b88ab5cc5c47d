"""Files handed to other launchers (``spark_submit.py`` for ``spark-submit``); nothing else lives here."""
