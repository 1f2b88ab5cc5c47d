"""The Schema Registry service's fetch and Java choice, without starting it (integration/test_schema_registry.py does)."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from connectors.services import schema_registry as sr
from eos_core.errors import ServiceError


def _jdk(root: Path, name: str, version: str) -> Path:
    home = root / name
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\nexit 1\n")
    java.chmod(0o755)
    (home / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{version}"\n')
    return java


def test_the_newest_java_21_or_later_is_chosen_beside_the_default_17(tmp_path: Path) -> None:
    jvm = tmp_path / "jvm"
    _jdk(jvm, "java-17-openjdk-amd64", "17.0.12")
    newest = _jdk(jvm, "temurin-25-jdk-amd64", "25.0.3")
    _jdk(jvm, "java-21-openjdk-amd64", "21.0.5")
    env = {"JAVA_HOME": str(jvm / "java-17-openjdk-amd64"), "PATH": "/nonexistent"}
    assert sr.registry_java(env, jvm_root=jvm) == newest


def test_no_java_21_names_what_was_found_and_each_way_out(tmp_path: Path) -> None:
    jvm = tmp_path / "jvm"
    _jdk(jvm, "java-17-openjdk-amd64", "17.0.12")
    with pytest.raises(ServiceError) as err:
        sr.registry_java({"PATH": "/nonexistent"}, jvm_root=jvm)
    text = str(err.value)
    assert "Java 21 or later" in text and "(Java 17)" in text
    assert sr.JAVA_ENV in text and sr.URL_ENV in text and "openjdk-21" in text


def test_a_named_java_older_than_21_is_refused_and_a_jdk_directory_is_taken(tmp_path: Path) -> None:
    old = _jdk(tmp_path, "jdk17", "17.0.2")
    with pytest.raises(ServiceError, match=rf"{sr.JAVA_ENV}=.*Java 17; Apicurio Registry needs Java 21"):
        sr.registry_java({sr.JAVA_ENV: str(old)}, jvm_root=tmp_path / "none")
    with pytest.raises(ServiceError, match="not a java executable or JDK directory"):
        sr.registry_java({sr.JAVA_ENV: str(tmp_path / "missing")}, jvm_root=tmp_path / "none")
    good = _jdk(tmp_path, "jdk25", "25.0.1")
    assert sr.registry_java({sr.JAVA_ENV: str(tmp_path / "jdk25")}, jvm_root=tmp_path / "none") == good


def _repo(tmp_path: Path, *, files: dict[str, bytes], sha1: str | None = None) -> Path:
    """A Maven repository on disk (file:// URLs) holding the registry's tarball and its .sha1."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    where = tmp_path / "repo" / "io/apicurio/apicurio-registry-app/9.9.9"
    where.mkdir(parents=True)
    (where / "apicurio-registry-app-9.9.9-all.tar.gz").write_bytes(blob)
    (where / "apicurio-registry-app-9.9.9-all.tar.gz.sha1").write_text(
        (sha1 or hashlib.sha1(blob).hexdigest()) + "  app.tar.gz\n"
    )
    return tmp_path / "repo"


def test_the_registry_is_fetched_checked_unpacked_once_then_cached(tmp_path: Path) -> None:
    repo = _repo(tmp_path, files={"quarkus-run.jar": b"jar", "lib/main/a.jar": b"a"})
    env = {"EOS_MAVEN_REPO": repo.as_uri(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    home = sr.registry_home("9.9.9", env)
    assert home == tmp_path / "cache" / "spark-eos" / "apicurio-registry-9.9.9"
    assert (home / "quarkus-run.jar").read_bytes() == b"jar" and (home / "lib/main/a.jar").is_file()
    for f in repo.rglob("*.tar.gz*"):  # the repository gone: the cache answers
        f.unlink()
    assert sr.registry_home("9.9.9", env) == home
    assert not list(home.parent.glob(".apicurio-registry-9.9.9-*"))  # no work dir left behind


def test_a_download_that_does_not_match_its_sha1_is_refused_and_nothing_is_cached(tmp_path: Path) -> None:
    repo = _repo(tmp_path, files={"quarkus-run.jar": b"jar"}, sha1="0" * 40)
    env = {"EOS_MAVEN_REPO": repo.as_uri(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    with pytest.raises(ServiceError, match="does not match the SHA-1 published beside it"):
        sr.registry_home("9.9.9", env)
    assert not (tmp_path / "cache" / "spark-eos" / "apicurio-registry-9.9.9").exists()


def test_a_tarball_without_the_app_and_an_unreachable_repository_are_clear_errors(tmp_path: Path) -> None:
    repo = _repo(tmp_path, files={"README": b"not the app"})
    env = {"EOS_MAVEN_REPO": repo.as_uri(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    with pytest.raises(ServiceError, match=r"holds no quarkus-run\.jar"):
        sr.registry_home("9.9.9", env)
    env["EOS_MAVEN_REPO"] = (tmp_path / "nowhere").as_uri()
    with pytest.raises(ServiceError) as err:
        sr.registry_home("9.9.9", env)
    assert "cannot fetch Apicurio Registry" in str(err.value) and sr.URL_ENV in str(err.value)
