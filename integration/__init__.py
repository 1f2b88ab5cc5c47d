"""Service-backed tests: Kafka, Postgres and Spark fixtures, connector tests, crash matrix."""
