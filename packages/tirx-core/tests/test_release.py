# SPDX-License-Identifier: Apache-2.0
"""tools/release.py: the release check (versions, CHANGELOG entries, tirx-core ranges) on a throwaway git repo and
on this tree, and the wheels it builds: the core plus one port installed into a fresh venv list exactly that port's
kernels."""

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
_spec = importlib.util.spec_from_file_location("tirx_release_tool", os.path.join(ROOT, "tools", "release.py"))
release = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))  # dataclasses look it up
_spec.loader.exec_module(release)

PYPROJECT = """[project]
name = "{name}"
version = "{version}"
dependencies = [{deps}]
"""


def _git(repo, *args):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def _package(repo, name, version, deps="", changelog=None):
    d = repo / "packages" / name
    (d / "src").mkdir(parents=True, exist_ok=True)
    (d / "pyproject.toml").write_text(PYPROJECT.format(name=name, version=version, deps=deps))
    (d / "src" / "mod.py").write_text("X = 1\n")
    entries = [version] if changelog is None else changelog
    (d / "CHANGELOG.md").write_text("# Changelog\n\n" + "".join(f"## {v} (unreleased)\n\n- what changed\n\n"
                                                                  for v in entries))
    return d


@pytest.fixture
def repo(tmp_path):
    """A two-package monorepo (the core and one port), committed, with no release tag yet."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    _package(r, "tirx-core", "0.1.0")
    _package(r, "tirx-port-a", "0.1.0", deps='"tirx-core>=0.1.0,<0.2"')
    _git(r, "add", "-A")
    _git(r, "commit", "-q", "-m", "first")
    return r


def _errors(repo):
    return release.check(str(repo))


def test_first_release_needs_only_the_changelog_entry(repo):
    assert _errors(repo) == []
    _package(repo, "tirx-port-a", "0.1.0", deps='"tirx-core>=0.1.0,<0.2"', changelog=["0.0.9"])
    errs = _errors(repo)
    assert len(errs) == 1 and "tirx-port-a" in errs[0] and "no entry for its version 0.1.0" in errs[0]
    (repo / "packages" / "tirx-port-a" / "CHANGELOG.md").unlink()
    assert ["tirx-port-a: packages/tirx-port-a/CHANGELOG.md is missing"] == _errors(repo)


def test_changed_package_needs_a_bump_and_an_entry(repo):
    _git(repo, "tag", "tirx-core-v0.1.0")
    _git(repo, "tag", "tirx-port-a-v0.1.0")
    assert _errors(repo) == []
    mod = repo / "packages" / "tirx-port-a" / "src" / "mod.py"
    mod.write_text("X = 2\n")  # uncommitted
    errs = _errors(repo)
    assert len(errs) == 1 and errs[0].startswith("tirx-port-a: packages/tirx-port-a/src/mod.py changed since its "
                                                 "release tirx-port-a-v0.1.0, but its version is still 0.1.0")
    _git(repo, "commit", "-q", "-am", "change")  # committed: the same
    assert len(_errors(repo)) == 1
    _package(repo, "tirx-port-a", "0.2.0", deps='"tirx-core>=0.1.0,<0.2"', changelog=["0.1.0"])  # bump, no entry
    errs = _errors(repo)
    assert len(errs) == 1 and "no entry for its version 0.2.0" in errs[0]
    _package(repo, "tirx-port-a", "0.2.0", deps='"tirx-core>=0.1.0,<0.2"', changelog=["0.2.0", "0.1.0"])
    assert _errors(repo) == []  # the core did not change: its 0.1.0 stays releasable untouched


def test_new_file_counts_and_versions_never_go_back(repo):
    _git(repo, "tag", "tirx-core-v0.1.0")
    (repo / "packages" / "tirx-core" / "src" / "new.py").write_text("Y = 1\n")  # untracked
    errs = _errors(repo)
    assert len(errs) == 1 and "tirx-core: packages/tirx-core/src/new.py changed since its release" in errs[0]
    _git(repo, "tag", "tirx-port-a-v0.3.0")
    assert "tirx-port-a: version 0.1.0 is below its last release tirx-port-a-v0.3.0" in _errors(repo)


def test_core_range_not_a_pin(repo):
    _package(repo, "tirx-port-a", "0.1.0", deps='"tirx-core==0.1.0"')
    errs = _errors(repo)
    assert len(errs) == 1 and "tirx-port-a: pins tirx-core==0.1.0 exactly" in errs[0]
    _package(repo, "tirx-port-a", "0.1.0", deps='"tirx-core>=0.2,<0.3"')
    assert _errors(repo) == ["tirx-port-a: requires tirx-core<0.3,>=0.2, which excludes the in-tree tirx-core 0.1.0"]
    _package(repo, "tirx-port-a", "0.1.0", deps="")
    assert _errors(repo) == ["tirx-port-a: its dependencies declare no tirx-core range (tirx-core>=X,<Y)"]


def test_this_tree_is_releasable():
    assert release.check(ROOT) == []
    names = {p.name for p in release.packages()}
    assert {"tirx-core", "tirx-native", "tirx-port-flashinfer"} <= names


def _run(*cmd, **kw):
    # Without the caller's PYTHONPATH (see test_uninstall.py: a GPU host's staged wheels would leak in).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_TARGET")}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r


def provide(py: str, name: str) -> None:
    """Copy the installed pure-Python distribution ``name`` into the venv of ``py``: the registry's one third-party
    import (``packaging``, a dependency of tirx-core) without the network that ``pip install`` would need."""
    site = _run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    dist = importlib.metadata.distribution(name)
    for f in dist.files:
        src = dist.locate_file(f)
        if "__pycache__" in f.parts or not os.path.isfile(src) or ".." in f.parts:
            continue
        os.makedirs(os.path.join(site, os.path.dirname(str(f))), exist_ok=True)
        shutil.copy2(src, os.path.join(site, str(f)))


def test_wheels_of_core_and_one_port_list_exactly_its_kernels(tmp_path):
    pytest.importorskip("hatchling", reason="hatchling builds the wheels")
    from tirx_kernels import registry

    dist = tmp_path / "dist"
    port = "tirx-port-flashinfer"
    core, ported = release.find("tirx-core"), release.find(port)
    built = release.build(core, str(dist)) + release.build(ported, str(dist))
    stems = [f"tirx_core-{core.version}", f"tirx_port_flashinfer-{ported.version}"]
    assert sorted(os.path.basename(p) for p in built) == sorted(
        [f"{s}-py3-none-any.whl" for s in stems] + [f"{s}.tar.gz" for s in stems])
    wheels = [p for p in built if p.endswith(".whl")]
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", str(venv))
    py = str(venv / "bin" / "python")
    # --no-deps: the registry needs neither torch nor tvm, and CI has no network.
    _run(py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *wheels)
    provide(py, "packaging")
    r = _run(py, "-m", "tirx_kernels.registry", "--format", "json", cwd=str(tmp_path))
    listed = {row["name"]: row["distribution"] for row in json.loads(r.stdout)}
    assert "refused" not in r.stderr, r.stderr
    want = {e.name for e in registry.list_kernels() if e.distribution == port}
    assert want and set(listed) == want and set(listed.values()) == {port}


def test_a_package_runs_its_tests_from_its_own_directory():
    # `pytest` inside packages/<p> (what a per-package release runs) finds the repository's pytest.ini from there and
    # collects only that package's tests; one of its files then runs (the whole suite is CI's job: ~50 s here). The
    # caller's environment is kept: a GPU host may import the packages through PYTHONPATH.
    pkg = os.path.join(ROOT, "packages", "tirx-port-cudnn")
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=pkg,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # --collect-only names tests from the rootdir (where pytest.ini is), -v from the invocation directory.
    collected = [line for line in r.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("packages/tirx-port-cudnn/tests/") for line in collected), \
        r.stdout[-2000:]
    r = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/test_package.py"],
                       cwd=pkg, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ran = [line for line in r.stdout.splitlines() if "::" in line]
    assert ran and all(line.startswith("tests/test_package.py::") and "PASSED" in line for line in ran), \
        r.stdout[-2000:]
