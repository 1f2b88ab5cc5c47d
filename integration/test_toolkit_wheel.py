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
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(REPO)], timeout=600)
    (wheel,) = (root / "dist").glob("spark_eos-*.whl")
    _run([sys.executable, "-m", "venv", str(root / "venv")], timeout=300)
    pip = str(root / "venv" / "bin" / "pip")
    _run([pip, "install", "-q", f"{wheel}[embedded]", "pytest"], timeout=1200)
    yield root / "venv"


def _env(venv: Path, kafka_service: object, postgres_service: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "EOS_FAULTS"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        PYSPARK_PYTHON=str(venv / "bin" / "python"),
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
    plugin = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_orders_chaos.py"], cwd=work, env=env,
                  timeout=1500)  # fmt: skip
    assert "1 passed" in plugin.stdout, plugin.stdout[-2000:]

    # 2. the command line, on the same job, whose table now refuses orders above 900 (dead letters)
    cli = _run(
        [str(wheel_venv / "bin" / "spark-eos"), "chaos", "--app", "orders_job:build", "--kills", "1", "--seed", "5",
         "--records", "300", "--max-offsets", "100", "--payload", "key,amount", "--workdir", str(tmp_path / "cli"),
         "--option", "max_amount=900", "--dead-letters", "{table}_refused", "--json", "--quiet"],
        cwd=work, env=env, timeout=1200,
    )  # fmt: skip
    report = json.loads(cli.stdout)
    assert report["ok"] is True, json.dumps(report["checks"], indent=1)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["chaos.kills"]["counts"]["sigkilled"] == 1
    info = report["info"]
    assert info["app"] == "orders_job:build" and info["dead_letters"] > 0, info  # ~10 % of amounts are above 900
    assert info["sink_rows"] + info["dead_letters"] == 300, info
    assert {"end.prepared", "end.decision_vs_commit"} <= set(checks), sorted(checks)
