"""No Postgres password in any plan, progress, error, event log or log line of real Spark queries.

A Spark application of its own (a subprocess: the event log and the plan description mode are
fixed when a SparkContext starts) writes through both sinks with the password inside the
``postgresql://user:password@`` DSN, as users write it: streaming queries, batch writes, the
foreachBatch adapters, a query that fails; with ``spark.sql.ui.explainMode=extended`` (the parsed
plan of a batch write prints the sink's options: ``AppendData ... [dsn=..., table=...]``) and INFO
logging. It collects ``query.explain(extended)``, ``lastProgress``, ``recentProgress``, the failed
query's exception text; the test then reads those, the event log and everything the application
printed: the password appears nowhere, and the options were printed (redacted), so the check is
not vacuous. The same run also writes through ``connectors.postgres_options`` (dsn without the
password, the ``password`` option) and through a dsn without any password (libpq's PGPASSWORD).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("plan_u", "plan_2", "plan_p", "plan_b", "plan_f", "plan_s")

APP = r"""
import contextlib, io, json, os, sys
root, dsn, work = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, root)
import connectors
from connectors.services.spark import local_session

spark = local_session("plan-probe", "local[2]", log_level="INFO", **{
    "spark.eventLog.enabled": "true", "spark.eventLog.dir": os.path.join(work, "events"),
    "spark.eventLog.compress": "false", "spark.sql.ui.explainMode": "extended"})
src = os.path.join(work, "in")
os.makedirs(src, exist_ok=True)
with open(os.path.join(src, "0.json"), "w") as fh:
    fh.write("".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in range(5)))
texts = {}

def stream(name, fmt, sink):
    w = spark.readStream.schema("id long, name string").json(src).writeStream
    w = w.foreachBatch(sink) if callable(sink) else w.format(fmt).options(**sink)
    q = w.option("checkpointLocation", os.path.join(work, "ck_" + name)).trigger(availableNow=True).start()
    try:
        q.awaitTermination()
    except Exception as exc:
        texts[name + ".exception"] = str(exc)
        texts[name + ".exception.repr"] = repr(exc)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        q.explain(True)
    texts[name + ".explain"] = buf.getvalue()
    texts[name + ".progress"] = str(q.lastProgress)
    texts[name + ".recent"] = str(q.recentProgress)
    texts[name + ".status"] = str(q.status)

def batch(name, fmt, options):
    df = spark.read.schema("id long, name string").json(src)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        df.explain(True)
    texts[name + ".df.explain"] = buf.getvalue()
    df.write.format(fmt).options(**options).mode("append").save()

base = {"dsn": dsn, "table": "plan_u", "key": "id"}
two = {"dsn": dsn, "table": "plan_2", "sink.id": "plan-2"}
stream("upsert", "postgres-upsert", base)
stream("twopc", "postgres-2pc", two)
stream("twopc.partition", "postgres-2pc", dict(two, table="plan_p", **{"sink.id": "plan-p", "visibility": "partition"}))
batch("upsert.batch", "postgres-upsert", base)
batch("twopc.batch", "postgres-2pc", dict(two, table="plan_b", **{"sink.id": "plan-b", "batch.id": "7"}))
stream("upsert.foreach", None, connectors.upsert_batch(dsn=dsn, table="plan_u", key="id"))
stream("twopc.foreach", None, connectors.twopc_batch(dsn=dsn, table="plan_f", **{"sink.id": "plan-f",
       "checkpointLocation": os.path.join(work, "ck_twopc.foreach")}))
stream("failing", "postgres-upsert", dict(base, table="plan_missing"))
safe = connectors.postgres_options(dsn)
stream("safe", "postgres-upsert", dict(base, **safe))
batch("safe.batch", "postgres-2pc", dict(two, table="plan_s", **safe, **{"sink.id": "plan-s", "batch.id": "1"}))
texts["conf"] = str(spark.sparkContext.getConf().getAll())
with open(os.path.join(work, "texts.json"), "w") as fh:
    json.dump(texts, fh)
spark.stop()
print("PROBE DONE", flush=True)
"""


def _forms(password: str) -> set[str]:
    return {password, quote(password, safe=""), quote(password)}


def test_no_password_in_plans_progress_errors_event_log_or_logs(postgres_service: Any, tmp_path: Path) -> None:
    dsn = postgres_service.dsn
    params = conninfo_to_dict(dsn)
    password = str(params.get("password") or "")
    if not password:  # a server named without a password: give the login one for this test
        password = "s3cret-" + os.urandom(6).hex()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"ALTER ROLE CURRENT_USER PASSWORD '{password}'")  # type: ignore[arg-type]
    uri = f"postgresql://{quote(str(params.get('user') or 'postgres'), safe='')}:{quote(password, safe='')}@" + (
        f"{params.get('host') or '127.0.0.1'}:{params.get('port') or 5432}/{params.get('dbname') or 'postgres'}"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[arg-type]
            conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text)")  # type: ignore[arg-type]
        conn.execute("DROP TABLE IF EXISTS plan_missing")
    (tmp_path / "events").mkdir()
    script = tmp_path / "app.py"
    script.write_text(APP)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PGPASSWORD", None)
    done = subprocess.run(
        [sys.executable, str(script), str(ROOT), uri, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    printed = done.stdout + done.stderr
    forms = _forms(password)
    assert not [f for f in forms if f in printed], "the password is in the application's output"
    assert done.returncode == 0 and "PROBE DONE" in done.stdout, printed[-4000:]
    texts: dict[str, str] = json.loads((tmp_path / "texts.json").read_text())
    for name, text in texts.items():
        assert not [f for f in forms if f in text], f"the password is in {name}"
    events = [p for p in (tmp_path / "events").rglob("*") if p.is_file()]
    log = "".join(p.read_text(errors="replace") for p in events)
    assert events and "SparkListenerSQLExecutionStart" in log
    assert not [f for f in forms if f in log], "the password is in the event log"
    # not vacuous: the options were printed, redacted; the failure and the plans were captured
    assert "dsn=*********(redacted)" in log, "the event log shows no sink options at all"
    # the safe form's password option is hidden by its key (and by the string regex: no "password=x" left)
    assert re.search(r"batch\.id=1, table=plan_s, \*{9}\(redacted\)", log), "the safe form's options are not shown"
    assert "AppendData" in log and "WriteToMicroBatchDataSource" in texts["upsert.explain"]
    assert "plan_missing" in texts["failing.exception"]
    # every write but the failing one went through: the password really was in use
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in TABLES:
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (5,), table  # type: ignore[arg-type]


def test_postgres_options_take_the_password_out_of_the_dsn() -> None:
    import connectors
    from eos_core.errors import ConfigError

    safe = connectors.postgres_options("postgresql://app:hunter%402@db:5432/shop?sslmode=require")
    assert safe["password"] == "hunter@2" and "hunter" not in safe["dsn"]
    assert conninfo_to_dict(safe["dsn"]) == {
        "user": "app",
        "host": "db",
        "port": "5432",
        "dbname": "shop",
        "sslmode": "require",
    }
    keyword = connectors.postgres_options(make_conninfo(host="db", user="app", password="a b'c"))
    assert keyword["password"] == "a b'c" and "password" not in keyword["dsn"]
    assert connectors.postgres_options("postgresql://app@db/shop") == {"dsn": "user=app dbname=shop host=db"}
    with pytest.raises(ConfigError) as err:
        connectors.postgres_options("postgresql://app:p@ss@db/shop")
    assert "p@ss" not in str(err.value) and "'dsn'" in str(err.value)


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _Session:
    def __init__(self, values: dict[str, str], core: dict[str, str]) -> None:
        self.conf = _Conf(values)
        self.core = core

    @property
    def sparkContext(self) -> Any:
        session = self

        class Ctx:
            def getConf(self) -> Any:
                return _Conf(session.core)

        return Ctx()


def test_register_keeps_sparks_default_url_redaction_when_nothing_is_set() -> None:
    # spark.conf.get of an unset redaction conf gives None, not Spark's default "(?i)url": taken as
    # empty, our regex alone would stop Spark hiding a JDBC `url` option (and its password) in plans
    import connectors

    s = _Session({}, {})
    connectors.redact_secrets(s)
    options = s.conf.values["spark.sql.redaction.options.regex"]
    assert options == "(?i)url|" + connectors.REDACTED_OPTIONS


def test_a_users_own_options_regex_still_hides_the_url_alias() -> None:
    # a regex the user sets replaces Spark's default "(?i)url": ours must hide the sinks' `url` alias itself
    import connectors

    s = _Session({"spark.sql.redaction.options.regex": "(?i)token"}, {})
    connectors.redact_secrets(s)
    options = s.conf.values["spark.sql.redaction.options.regex"]
    assert options == "(?i)token|" + connectors.REDACTED_OPTIONS
    assert re.search(connectors.REDACTED_OPTIONS, "url") and not re.search("(?i)token", "url")


def test_register_extends_the_users_redaction_regexes_once() -> None:
    import connectors

    s = _Session({"spark.sql.redaction.options.regex": "(?i)url"}, {"spark.redaction.string.regex": "(?i)token=\\w+"})
    connectors.redact_secrets(s)
    connectors.redact_secrets(s)  # idempotent
    options = s.conf.values["spark.sql.redaction.options.regex"]
    strings = s.conf.values["spark.sql.redaction.string.regex"]
    assert options == "(?i)url|" + connectors.REDACTED_OPTIONS
    assert strings == "(?i)token=\\w+|" + connectors.REDACTED_STRINGS  # the core regex it fell back to is kept
    # (Java takes "(?i)" anywhere in a pattern; Python only at the start: ours is checked on its own)
    for key in ("dsn", "DSN", "password", "sslpassword", "url", "URL"):  # url: the sinks' alias of dsn
        assert re.search(connectors.REDACTED_OPTIONS, key), key
    for key in ("table", "dsn.extra", "key", "dbtable", "url.extra"):
        assert not re.search(connectors.REDACTED_OPTIONS, key), key
    text = "WriteTo [dsn=postgresql://app:hunter2@db:5432/shop, x=host=db password='a b\\' c' user=app]"
    hidden = re.sub(connectors.REDACTED_STRINGS, "***", text)
    assert "hunter2" not in hidden and "a b" not in hidden and " c'" not in hidden, hidden
    assert "db:5432/shop" in hidden and "user=app" in hidden, hidden
