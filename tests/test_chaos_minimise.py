"""Failure minimisation (connectors.toolkit.chaos.minimise): drop kills one at a time, keep the
smallest schedule that still fails, and print the command that reproduces it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from connectors.toolkit import chaos, checker, oracle
from eos_core.errors import ConfigError


def _cfg(tmp_path: Path, **kw: object) -> chaos.ChaosConfig:
    base: dict[str, object] = dict(
        pipeline="app",
        kills=4,
        seed=49,
        records=300,
        bootstrap="b:1",
        dsn="postgresql://h/d",
        workdir=str(tmp_path),
        app="insert_job:build",
        sink_kind="foreachbatch",
        generator="insert_job:records",
        oracle="append",
    )
    base.update(kw)
    return chaos.ChaosConfig(**base)  # type: ignore[arg-type]


def test_only_kills_keeps_the_seeds_kills_and_their_numbers(tmp_path: Path) -> None:
    full = chaos.plan_kills("foreachbatch", 4, 49)
    cfg = _cfg(tmp_path, only_kills=(1, 3))
    assert chaos.schedule.planned_kills(cfg) == [full[1], full[3]] and cfg.planned == 2
    with pytest.raises(ConfigError, match=r"--only-kills 1,4: kill numbers from 0 to 3 \(--kills 4\)"):
        chaos.prepare(None, app="insert_job:build", kills=4, only_kills=(1, 4), workdir=str(tmp_path))  # type: ignore[arg-type]


def test_minimise_drops_every_kill_the_failure_does_not_need(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, ...]] = []

    def fake_run(self: chaos.Experiment, cfg: chaos.ChaosConfig | None = None) -> checker.Report:
        assert cfg is not None and cfg.only_kills is not None
        seen.append(cfg.only_kills)
        culprit = 2 in cfg.only_kills  # this job fails whenever kill 2 strikes, and only then
        return checker.Report([checker.Check("oracle.table", not culprit, "")])

    monkeypatch.setattr(chaos.Experiment, "run", fake_run)
    cfg = _cfg(tmp_path)
    report = checker.Report([checker.Check("oracle.table", False, "")])
    found = chaos.minimise(cfg, report)
    assert found["kills"] == [2] and report.info["minimised"] is found
    assert seen == [(1, 2, 3), (2, 3), (3,), (2,)]  # dropped 0, then 1; 2 is needed (kept); dropped 3
    plan = chaos.plan_kills("foreachbatch", 4, 49)[2]
    assert found["schedule"] == [f"2: {plan.kind}" + (f" {plan.point}" if plan.point else "")]
    argv = shlex.split(found["command"])
    assert argv[:4] == ["spark-eos", "chaos", "--app", "insert_job:build"]
    for flag, value in [
        ("--seed", "49"),
        ("--kills", "4"),
        ("--only-kills", "2"),
        ("--oracle", "append"),
        ("--generator", "insert_job:records"),
        ("--sink-kind", "foreachbatch"),
    ]:
        assert argv[argv.index(flag) + 1] == value


def test_a_cannot_judge_trial_is_not_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def undecided(self: chaos.Experiment, cfg: chaos.ChaosConfig | None = None) -> checker.Report:
        return checker.Report(
            [checker.Check("oracle.reference_deterministic", False, "")], {"verdict": oracle.CANNOT_JUDGE}
        )

    monkeypatch.setattr(chaos.Experiment, "run", undecided)
    found = chaos.minimise(_cfg(tmp_path, kills=3), checker.Report([checker.Check("x", False, "")]))
    assert found["kills"] == [0, 1, 2] and all(not t["fails"] for t in found["trials"])
