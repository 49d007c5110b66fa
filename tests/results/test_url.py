"""`--db` as a URL: the forms taken, a password refused (and masked), EDGEOPT_DB, bad input in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeopt.errors import UsageError
from edgeopt.results_url import local_path, mask, parse


def test_paths_and_sqlite_urls(monkeypatch):
    monkeypatch.delenv("EDGEOPT_DB", raising=False)
    assert parse(None).kind == "sqlite" and parse(None).path == Path("edgeopt-results.db")
    assert parse("ci/runs.db").path == Path("ci/runs.db")
    assert parse("sqlite:///ci/runs.db").path == Path("ci/runs.db")
    assert parse("sqlite:////abs/runs.db").path == Path("/abs/runs.db")
    monkeypatch.setenv("EDGEOPT_DB", "sqlite:///from-env.db")
    assert parse(None).path == Path("from-env.db") and parse("given.db").path == Path("given.db")


def test_postgresql_urls(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEOPT_SPOOL", str(tmp_path / "s.db"))
    s = parse("postgresql://rig@db.lab:5433/edgeopt?sslmode=require")
    assert s.is_server and s.shown == "postgresql://rig@db.lab:5433/edgeopt?sslmode=require"
    assert s.url == "postgresql+psycopg://rig@db.lab:5433/edgeopt?sslmode=require"  # sslmode passed through
    assert s.path == tmp_path / "s.db" and local_path(s.shown) == tmp_path / "s.db"
    monkeypatch.delenv("EDGEOPT_SPOOL")
    a, b = parse("postgresql://rig@h/x").path, parse("postgresql://rig@h/y").path
    assert a != b and a.parent == b.parent  # one spool per server database


@pytest.mark.parametrize("url", ["postgresql://rig:s3cret@db.lab/edgeopt", "postgres://rig:s3cret@db.lab:5432/e",
                                 "postgresql://rig@db.lab/edgeopt?password=s3cret"])
def test_a_password_in_the_url_is_refused_and_never_printed(url):
    with pytest.raises(UsageError) as e:
        parse(url)
    assert "s3cret" not in str(e.value) and "password" in str(e.value)
    assert e.value.exit_code == 2


def test_bad_urls():
    for bad in ("mysql://x@h/db", "postgresql://rig@h/", "sqlite://relative.db", "postgresql://rig@h:99999/db"):
        with pytest.raises(UsageError):
            parse(bad)
    assert mask("see postgresql://u:pw@h/db and more") == "see postgresql://u:***@h/db and more"
