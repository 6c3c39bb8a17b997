# SPDX-License-Identifier: Apache-2.0
"""reference_requirements resolve against what is installed."""

import pytest

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


def test_refused_upstream_turns_only_the_marked_refusal_into_a_missing_reference():
    from tirx_kernels.core.references import refused_upstream

    with pytest.raises(ImportError, match="fla's backward refuses.*Triton 3.6 miscompiles"):
        with refused_upstream("Triton", "fla's backward refuses this Triton on Hopper"):
            raise RuntimeError("Triton 3.6 miscompiles this kernel on Hopper (issue 640)")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        with refused_upstream("Triton", "x"):
            raise RuntimeError("CUDA error: an illegal memory access")
    with pytest.raises(ValueError):
        with refused_upstream("Triton", "x"):
            raise ValueError("Triton")
    with refused_upstream("Triton", "x"):
        pass
