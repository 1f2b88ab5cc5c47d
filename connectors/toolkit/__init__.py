"""The fault-injection toolkit users run on their own jobs: chaos runs, the exact checker, the harness
that starts and kills a job, the app runner and the pytest plugin (``eos_chaos``, ``eos_kafka``, ...)."""
