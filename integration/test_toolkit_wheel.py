"""The fault-injection toolkit as users get it: from the wheel, in a fresh venv, outside the clone.

Builds the wheel, installs it (with the ``embedded`` extra and pytest) into a new venv, copies
``examples/orders`` (a user's job, not one of our pipelines) to a directory outside the clone, and
chaos-tests it twice: through the pytest plugin (``eos_chaos``) and through ``spark-eos chaos
--app``. Both must end with the checker's verdict "exactly once" and prove their kills happened.
The session's Kafka and Postgres are handed over by ``EOS_KAFKA_BOOTSTRAP``/``EOS_POSTGRES_DSN``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from connectors.services import spark_cds
from connectors.services.apache_kafka import without_class_archives

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    assert out.returncode == 0, f"{argv[:4]} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with the wheel (and its dependencies from the package index / pip's cache)."""
    root = tmp_path_factory.mktemp("wheel")
    # built from a copy: `make test` installs the clone into .venv-peer meanwhile, and setuptools builds in
    # the source tree (build/, *.egg-info), where two builds at once would meet
    source = root / "source"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "spark-warehouse", ".eos"
        ),
    )
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(source)], timeout=600)
    (wheel,) = (root / "dist").glob("spark_eos-*.whl")
    _run([sys.executable, "-m", "venv", str(root / "venv")], timeout=300)
    pip = str(root / "venv" / "bin" / "pip")
    # protobuf: PySpark's transformWithState client imports it (examples/balances; a user of that API has it)
    # --no-compile: pip would compile every module of PySpark and pandas (tests too); Python compiles and
    # caches the ones the examples import
    _run([pip, "install", "-q", "--no-compile", f"{wheel}[embedded]", "pytest", "protobuf>=5"], timeout=1200)
    # this venv's Spark is another installation, readied as conftest.py readies the suite's: PySpark's zip gets
    # its bytecode, and its JVMs a class archive of their own, kept with the venv (40 s once; the examples'
    # runs start some 30 Spark JVMs, each about 4 s sooner, and their Python workers compile no PySpark)
    base = without_class_archives(os.environ.get(spark_cds.ENV, ""))
    ready = "import sys; from connectors.services import spark_bytecode, spark_cds; spark_bytecode.precompile(); "
    built = _run(
        [str(root / "venv" / "bin" / "python"), "-c", ready + "print(spark_cds.build_archive(sys.argv[1]))", base],
        cwd=root,
        timeout=900,
        env=_outside(XDG_CACHE_HOME=str(root)),
    )
    archive = built.stdout.strip().splitlines()[-1]
    assert archive.endswith(".jsa"), built.stdout + built.stderr  # a build that fails would cost every run its start
    (root / "jvm-options").write_text(f"{base} {spark_cds.archive_options(Path(archive))}".strip())
    yield root / "venv"


def _outside(**extra: str) -> dict[str, str]:
    """The environment without the clone's Python and Spark settings (the wheel's package and Spark, not the clone's)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "EOS_FAULTS", "SPARK_HOME"))
    }
    return {**env, **extra}


def _env(venv: Path, kafka_service: object, postgres_service: object) -> dict[str, str]:
    env = _outside()
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        PYSPARK_PYTHON=str(venv / "bin" / "python"),
        JDK_JAVA_OPTIONS=(venv.parent / "jvm-options").read_text(),  # its Spark's class archive (wheel_venv)
        EOS_KAFKA_BOOTSTRAP=kafka_service.bootstrap,  # type: ignore[attr-defined]
        EOS_POSTGRES_DSN=postgres_service.dsn,  # type: ignore[attr-defined]
    )
    return env


def test_example_job_is_chaos_tested_from_the_wheel_by_plugin_and_cli(
    wheel_venv: Path, kafka_service: object, postgres_service: object, tmp_path: Path
) -> None:
    work = tmp_path / "user-project"
    shutil.copytree(REPO / "examples" / "orders", work)
    env = _env(wheel_venv, kafka_service, postgres_service)
    python = str(wheel_venv / "bin" / "python")

    # the package comes from the venv, not from the clone
    where = _run([python, "-c", "import connectors, sinks, sources; print(connectors.__file__)"], cwd=work, env=env)
    assert where.stdout.strip().startswith(str(wheel_venv)), where.stdout

    # 1. the pytest plugin, its fixtures found through the entry point
    plugin = _run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_orders_chaos.py"],
        cwd=work,
        env=env,
        timeout=1500,
    )
    assert "1 passed" in plugin.stdout, plugin.stdout[-2000:]

    # 2. the command line, on the same job, whose table now refuses orders above 900 (dead letters)
    cli = _run(
        [
            str(wheel_venv / "bin" / "spark-eos"),
            "chaos",
            "--app",
            "orders_job:build",
            "--kills",
            "1",
            "--seed",
            "5",
            "--records",
            "300",
            "--max-offsets",
            "100",
            "--payload",
            "key,amount",
            "--workdir",
            str(tmp_path / "cli"),
            "--option",
            "max_amount=900",
            "--dead-letters",
            "{table}_refused",
            "--json",
            "--quiet",
        ],
        cwd=work,
        env=env,
        timeout=1200,
    )
    report = json.loads(cli.stdout)
    assert report["ok"] is True, json.dumps(report["checks"], indent=1)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["chaos.kills"]["counts"]["sigkilled"] == 1
    info = report["info"]
    assert info["app"] == "orders_job:build" and info["dead_letters"] > 0, info  # ~10 % of amounts are above 900
    assert info["sink_rows"] + info["dead_letters"] == 300, info
    assert {"end.prepared", "end.decision_vs_commit"} <= set(checks), sorted(checks)


NEW_EXAMPLES = ("enrich", "dedup", "balances", "windows")


def test_join_dedup_and_state_examples_are_chaos_tested_from_the_wheel_with_every_kind_of_fault(
    wheel_venv: Path, kafka_service: object, postgres_service: object, tmp_path: Path
) -> None:
    """Issue 30 item 6: a stream-static join into postgres-2pc, a dedup with watermark, a
    transformWithStateInPandas job and 10-second windows in update mode (the foreachBatch upsert
    adapter), each with its own record format, chaos-tested from the wheel by their own tests (the
    plugin, the reference-run oracle) under kills and faults of the services: pg-crash, kafka-cut (a broker of the run's own behind a proxy), pg-restart, pg-stall,
    executor-loss. No service is named: the Postgres faults restart the server the plugin runs, the
    Kafka faults need a broker the run starts itself (a named one is refused). enrich leaves a report."""
    work = tmp_path / "user-project"
    work.mkdir()
    for example in NEW_EXAMPLES:
        for f in (REPO / "examples" / example).iterdir():
            if f.is_file():
                shutil.copy(f, work / f.name)
    env = {
        k: v
        for k, v in _env(wheel_venv, kafka_service, postgres_service).items()
        if k not in ("EOS_KAFKA_BOOTSTRAP", "EOS_POSTGRES_DSN")
    }
    env["EOS_SERVICES"] = "embedded"
    python = str(wheel_venv / "bin" / "python")
    base = tmp_path / "pt"
    out = _run(
        [
            python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(base),
            "-rA",
            *(f"test_{e}_chaos.py" for e in NEW_EXAMPLES),
        ],
        cwd=work,
        env=env,
        timeout=2400,
    )
    assert f"{len(NEW_EXAMPLES)} passed" in out.stdout, out.stdout[-3000:]
    # the report enrich's test asked for: a timeline of its runs with the kill and the faults, and JUnit
    (page_path,) = base.glob("test_enriched_orders*0/report/report.html")  # not pytest's "current" link
    page = page_path.read_text()
    assert "EXACTLY-ONCE HELD" in page and "http" not in page, page[:2000]
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert 'class="kill"' in svg and svg.count('class="outside ok"') == 2 and 'class="batch"' in svg, svg[:3000]
    assert "drain" in svg and "reference" in svg
    import xml.etree.ElementTree as ET

    suite = ET.parse(page_path.with_name("junit.xml")).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0" and int(suite.get("tests") or 0) >= 5
    shutil.copytree(page_path.parent, tmp_path.parent / "enrich-report", dirs_exist_ok=True)  # kept to look at
