"""The suite's xdist groups hold: every test of a group runs on one pytest worker (conftest.py).

pytest-xdist's own ``--dist loadgroup`` lost the groups under pytest 9 (the "@group" suffix it puts on
a node id is written where pytest 9 no longer reads it), and nothing failed: both workers built the
shipped environment and a standalone Spark cluster at once. This runs the real collection on two
workers with every test skipped at its setup (no fixture, no service) and reads where each one ran.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

from conftest import _GROUPS, xdist_group_of

REPO = Path(__file__).resolve().parent.parent

RECORDER = """
import os, pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    with open(os.environ["EOS_GROUPS_LOG"], "a") as f:
        f.write(f"{os.environ.get('PYTEST_XDIST_WORKER')} {item.nodeid}\\n")
    pytest.skip("placement only")
"""


def test_every_group_runs_on_one_worker_and_the_rest_on_both(tmp_path: Path) -> None:
    (tmp_path / "eos_groups_recorder.py").write_text(RECORDER)
    log = tmp_path / "placement.txt"
    files = [*sorted(set(_GROUPS)), "integration/test_upsert.py", "integration/test_kafka_source.py"]
    env = {**os.environ, "EOS_GROUPS_LOG": str(log), "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-p",
            "eos_groups_recorder",
            "-q",
            "-p",
            "no:cacheprovider",
            *files,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    placed = [line.split(" ", 1) for line in log.read_text().splitlines()]
    workers: dict[str, set[str]] = collections.defaultdict(set)
    for worker, nodeid in placed:
        workers[xdist_group_of(nodeid) or "-"].add(worker)
    assert set(workers) == set(_GROUPS.values()) | {"-"}, sorted(workers)  # every group's tests were collected
    split = {group: sorted(ws) for group, ws in workers.items() if group != "-" and len(ws) != 1}
    assert not split, f"groups run on more than one worker: {split}"
    assert workers["-"] == {"gw0", "gw1"}, "the tests of no group did not spread over both workers"
    assert len(placed) == int(out.stdout.rsplit(" skipped", 1)[0].rsplit(None, 1)[-1])  # each test placed once


def test_a_group_is_named_by_the_test_file_not_by_its_name_alone() -> None:
    assert xdist_group_of("integration/test_cluster.py::test_f17[ledger-spark-submit]") == "cluster"
    assert xdist_group_of("integration/test_docker_hygiene.py::test_x") == "docker"
    # tests/ has a file of the same name as a grouped integration module: it is not in the group
    assert xdist_group_of("tests/test_services_apache_kafka.py::test_cluster_id_is_a_kafka_uuid") is None
    assert xdist_group_of("integration/test_upsert.py::test_x") is None


def test_a_module_that_names_an_xdist_group_is_in_the_groups_the_scheduler_reads() -> None:
    """A module's own ``pytest.mark.xdist_group`` is not read (see above): conftest.py's ``_GROUPS`` must list it."""
    import re

    named = {
        f"integration/{path.name}": m.group(1)
        for path in sorted((REPO / "integration").glob("test_*.py"))
        for m in [re.search(r"xdist_group\(\"([^\"]+)\"\)", path.read_text())]
        if m
    }
    assert named and {f: _GROUPS.get(f) for f in named} == named
