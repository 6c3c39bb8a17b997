# SPDX-License-Identifier: Apache-2.0
"""reference_requirements resolve against what is installed."""

from tirx_kernels.core import references


def test_installed_package_with_matching_specifier():
    ok, detail = references.resolve({"package": "packaging", "import": "packaging", "specifier": ">=20"})
    assert ok, detail


def test_wrong_version_is_reported():
    ok, detail = references.resolve({"package": "packaging", "import": "packaging", "specifier": "<1"})
    assert not ok and "does not satisfy <1" in detail


def test_missing_package_is_reported_with_reason():
    ok, detail = references.resolve({"package": "surely-not-installed-xyz", "import": "nope", "specifier": "==1"})
    assert not ok and "not installed" in detail


def test_commit_pin_mismatch():
    ok, detail = references.resolve({"package": "packaging", "import": "packaging", "commit": "0" * 40})
    assert not ok and "pinned" in detail
