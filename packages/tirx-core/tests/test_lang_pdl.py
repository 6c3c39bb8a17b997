# SPDX-License-Identifier: Apache-2.0
"""``core.lang.pdl``: the host wrapper of an enabled kernel sets the programmatic-stream-serialization launch
attribute, a plain one does not; in SASS the wait (ACQBULK) precedes every global access and the trigger
(PREEXIT) follows the last store. The GPU half (chained calls of the kernels that use it) is in the kernel
packages' GPU tests."""

import re
import shutil

import pytest

pytest.importorskip("tvm")

from tvm.script import tirx as T  # noqa: E402

from tirx_kernels.core import build  # noqa: E402
from tirx_kernels.core.lang import pdl, vector  # noqa: E402

ATTR = "programmaticStreamSerializationAllowed = 1"


def _copy_kernel(trigger):
    words = vector.WORDS_PER_VECTOR

    @T.prim_func
    def pdl_copy(x_ptr: T.handle, y_ptr: T.handle):
        M = T.int32()
        X = T.match_buffer(x_ptr, (M, 1024), "bfloat16", align=16)
        Y = T.match_buffer(y_ptr, (M, 1024), "bfloat16", align=16)
        T.device_entry()
        cta = T.cta_id([M])
        tid = T.thread_id([128])
        xr = T.alloc_local((words,), "uint32")
        pdl.begin(trigger)
        vector.load_v4(xr, 0, X.ptr_to([cta, tid * 8]))
        vector.store_v4(Y.ptr_to([cta, tid * 8]), xr, 0)
        pdl.end(trigger)

    return pdl.launch(pdl_copy, trigger)


def test_enable_sets_the_launch_attribute():
    assert ATTR in build.codegen(_copy_kernel("end"))
    assert ATTR not in build.codegen(_copy_kernel(None)) and "griddepcontrol" not in build.codegen(_copy_kernel(None))
    with pytest.raises(ValueError, match="k: pdl 'late' is not None or one of"):
        pdl.check_trigger("k", "late")
    pdl.check_trigger("k", None)


@pytest.mark.skipif(shutil.which("nvcc") is None or build.cuobjdump() is None, reason="needs nvcc and cuobjdump")
@pytest.mark.parametrize("trigger", ["end", "early"])
def test_sass_waits_before_global_accesses(tmp_path, trigger):
    res = build.build_so(_copy_kernel(trigger), str(tmp_path / "pdl.so"))
    sass = [line for line in build.sass(res.so_path).splitlines() if re.search(r"ACQBULK|PREEXIT|LDG|STG", line)]
    ops = [re.search(r"ACQBULK|PREEXIT|LDG|STG", line).group(0) for line in sass]
    assert ops[0] == "ACQBULK" and ops.count("ACQBULK") == 1 and ops.count("PREEXIT") == 1
    assert ops.index("PREEXIT") == (len(ops) - 1 if trigger == "end" else 1)
