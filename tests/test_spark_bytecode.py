"""PySpark's zipped modules with their bytecode (connectors/services/spark_bytecode.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from connectors.services import spark_bytecode


def _home(tmp_path: Path, mod: str = "def f():\n    raise ValueError('from the source')\n") -> Path:
    lib = tmp_path / "spark" / "python" / "lib"
    lib.mkdir(parents=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as zf:
        zf.writestr("pyspark/__init__.py", "")
        zf.writestr("pyspark/mod.py", mod)
        zf.writestr("pyspark/tests/test_x.py", "x = 1 is 1\n")  # a SyntaxWarning: tests are left as they are
    return tmp_path / "spark"


def _import(zip_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(zip_path)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )


def test_the_zip_gains_bytecode_that_workers_import(tmp_path: Path) -> None:
    home = _home(tmp_path)
    zip_path = home / "python" / "lib" / "pyspark.zip"
    assert not spark_bytecode.precompiled(zip_path)
    assert spark_bytecode.precompile(home) == [zip_path]
    names = zipfile.ZipFile(zip_path).namelist()
    assert {"pyspark/__init__.pyc", "pyspark/mod.pyc"} <= set(names) and "pyspark/tests/test_x.pyc" not in names
    assert spark_bytecode.precompiled(zip_path) and spark_bytecode.precompile(home) == []  # once
    out = _import(
        zip_path,
        "import pyspark.mod as m, traceback; print(m.__file__)\ntry: m.f()\nexcept ValueError: traceback.print_exc()",
    )
    assert out.stdout.strip() == f"{zip_path}/pyspark/mod.pyc", out.stdout + out.stderr
    # a traceback names the module as zipimport does when it compiles the source, with its line
    assert f'File "{zip_path}/pyspark/mod.py", line 2, in f' in out.stderr and "raise ValueError" in out.stderr


def test_bytecode_that_does_not_match_its_source_is_not_used(tmp_path: Path) -> None:
    home = _home(tmp_path)
    zip_path = home / "python" / "lib" / "pyspark.zip"
    spark_bytecode.precompile(home)
    changed = tmp_path / "changed.zip"
    with zipfile.ZipFile(zip_path) as zin, zipfile.ZipFile(changed, "w") as zout:
        for info in zin.infolist():
            new = b"def f():\n    return 'edited'\n" if info.filename == "pyspark/mod.py" else zin.read(info)
            zout.writestr(info, new)
    out = _import(changed, "import pyspark.mod as m; print(m.f())")
    assert out.stdout.strip() == "edited", out.stdout + out.stderr


def test_eos_spark_bytecode_0_leaves_the_zip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _home(tmp_path)
    monkeypatch.setenv(spark_bytecode.BYTECODE_ENV, "0")
    assert spark_bytecode.precompile(home) == []
    assert not spark_bytecode.precompiled(home / "python" / "lib" / "pyspark.zip")


def test_the_suites_pyspark_zip_holds_bytecode() -> None:
    """conftest.py precompiled it: the suite's Python workers import PySpark without compiling it."""
    from connectors.services import spark_cds

    home = spark_cds.spark_home()
    if os.environ.get(spark_bytecode.BYTECODE_ENV) == "0":  # a user's choice, never CI's: nothing rewritten now
        assert spark_bytecode.precompile(home) == []
        return
    assert spark_bytecode.precompiled(home / "python" / "lib" / "pyspark.zip")
