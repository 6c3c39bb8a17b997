# SPDX-License-Identifier: Apache-2.0
"""The general act_and_mul kernel: d, the row strides and every pointer's alignment are runtime values, so one
artifact per (act, dtype) serves every call the specialized kernels (d a compile-time multiple of 8, 16-byte
rows) do not: odd d, d missing from a bundle, rows or pointers off 16 bytes.

Design: a row's output is cut into *chunks* of 8 columns aligned to out's 16-byte boundaries: chunk ``k`` covers
columns ``c0 = 8 k - ao ..+8``, where ``ao`` (0..7) is how many elements the out row starts past a 16-byte
boundary (base pointer + row * stride: a per-row value). One thread computes one chunk and stores it with one
16-byte store; only the first and the last chunk of a row (the unaligned head and tail) store element by element.
- Gate and up of a chunk lie ``sg = (ag - ao) mod 8`` and ``su`` elements past their own 16-byte boundaries
  (``ag`` / ``au``: the gate / up row's misalignment, ``au = ag + d``; for an odd d the three differ). A source
  with shift 0 is one 16-byte load; otherwise the two aligned vectors around the chunk are loaded (the second one
  is the next thread's first: an L1 hit, DRAM bytes unchanged) and shifted down by the shift in registers (two
  word selects and a 16-bit funnel per word: ``rowwise.shift_down``; no local memory). Each aligned vector is
  loaded only where it holds an element of the row: it then lies in the same 16-byte block, so in mapped memory,
  even at the row's ends.
- Row layout by ``cmax`` (the chunks of the longest row): rows of up to 128 chunks are packed ``256 / L`` a CTA
  (``L``: the next power of two, lanes of a row); longer rows are cut into ``segs = ceil(cmax / 256)`` segments
  of 256 lanes (the last one's idle warps exit at once; balancing the segments gives the same CTA and active-warp
  counts, for a division before the first load). Rows go on blockIdx.x (< 2**31), segments on blockIdx.y with a
  grid-stride loop past 65535 (d > 134M), so no grid dimension passes its limit; row offsets are 64-bit.
- The same arguments as the specialized kernel (``x, out, zero``): a bundle serves a specialized call with this
  artifact unchanged (``general_params``). L2 evict_last loads, PDL and ``vector.after_all`` as the specialized
  kernel (``act_and_mul.LOAD_POLICY`` / ``PDL``). 48 registers, 0-byte stack, no spills (ptxas, nvcc 13.0; a
  ``__launch_bounds__`` cap of 40 or 32 registers spilled 16 / 88 bytes); the 4 predicated LDG.E.128 issue back
  to back. Not yet timed on a GPU.
- Schedule knob for odd d (issue 19; tools/sweeps/odd_sizes.py times it, the default stays 1 until measured):
  ``chunks_per_thread=2`` gives a thread two neighbouring chunks (the plan above counts lanes in pairs of chunks):
  their gate (and up) take three aligned vectors instead of four, the middle one shared, so a shifted source
  costs 1.5 vector loads a chunk instead of 2 (the second of each pair was an L1 hit, now no request at all).
"""

from __future__ import annotations

THREADS = 256
CHUNKS_PER_THREAD = 1  # the odd-d knob's default (tools/sweeps/odd_sizes.py times 2)
MAX_GRID_Y = 65535
_VEC = 8
_WORDS = 4


def lanes_log2(cmax, device: bool = False):
    """log2 of the lanes a row gets, ``ceil(log2(min(cmax, 256)))`` (Python ints or TIR expressions). In device code
    one FLO (``clz``), where a chain of 8 compares put ~25 dependent ops before the first load; the host's C
    codegen has no clz: the compares there."""
    if isinstance(cmax, int):
        return sum(int(cmax > 1 << i) for i in range(8))
    from tvm.script import tirx as T

    if device:
        return T.min(32 - T.clz(cmax - 1), 8)
    return sum(T.Cast("int32", cmax > (1 << i)) for i in range(8))


def plan(d: int, rows_aligned: bool = True, chunks_per_thread: int = CHUNKS_PER_THREAD) -> dict:
    """The launch geometry for ``d`` (the kernel's expressions in Python, for tests): ``cmax`` chunks planned a
    row (``d / 8`` where d and out's row stride are multiples of 8, else ``ceil((d + 7) / 8)``, the most any
    alignment gives), ``rows_per_cta``, ``segments``, ``width`` lanes a segment, ``grid(M)`` -> (x, y)."""
    cmax = d >> 3 if d % _VEC == 0 and rows_aligned else (d + 14) >> 3
    units = (cmax + chunks_per_thread - 1) // chunks_per_thread  # what a lane takes: chunks_per_thread chunks
    lg = lanes_log2(units)
    segs = (units + THREADS - 1) // THREADS
    width = 1 << lg
    rows = THREADS >> lg
    return {"cmax": cmax, "rows_per_cta": rows, "segments": segs, "width": width,
            "grid": lambda M: ((M + rows - 1) >> (8 - lg), min(segs, MAX_GRID_Y))}


def build_general(act: str, dtype: str, load_policy: str | None, store_policy: str | None, pdl: str | None,
                  chunks_per_thread: int = CHUNKS_PER_THREAD):
    """The general kernel for (act, dtype); ``chunks_per_thread`` (1 or 2): the odd-d knob of the docstring."""
    if chunks_per_thread not in (1, 2):
        raise ValueError(f"act_and_mul general: chunks_per_thread {chunks_per_thread} (1 or 2)")
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import rowwise, vector

    from .act_and_mul import _act_vector

    pdl_launch.check_trigger("act_and_mul", pdl)
    access = vector.AccessPolicies("act_and_mul", {"load": load_policy, "store": store_policy})

    def max_chunks(d, y_stride):
        """Chunks the launch plans a row for (host and device): ``cmax`` of :func:`plan`. Rows of d / 8 chunks
        whose out pointer is off 16 bytes have d / 8 + 1: lane 0 of segment 0 takes the last one (the loop)."""
        return T.if_then_else(T.And((d & 7) == 0, (y_stride & 7) == 0), d >> 3, (d + 14) >> 3)

    def units(chunks):
        """Lanes' worth of work in ``chunks`` chunks (one lane: ``chunks_per_thread`` neighbouring chunks)."""
        return chunks if chunks_per_thread == 1 else (chunks + 1) >> 1

    def load_pair_source(regs, Xf, x_base, off, c0, s, d, two, policy):  # noqa: N803
        """``regs[0:12]`` <- the three aligned vectors around the chunks at ``c0`` and ``c0 + 8`` (``two``: the
        second exists), each only where a chunk needs it and it holds a row element."""
        start = x_base + T.Cast("int64", off) + T.Cast("int64", c0 - s)
        vector.load_v4(regs, 0, Xf.ptr_to([start]), c0 + _VEC - s > 0, policy=policy)
        vector.load_v4(regs, _WORDS, Xf.ptr_to([start + _VEC]), T.And(T.Or(s > 0, two), c0 + _VEC - s < d),
                       policy=policy)
        vector.load_v4(regs, 2 * _WORDS, Xf.ptr_to([start + 2 * _VEC]),
                       T.And(T.And(s > 0, two), c0 + 2 * _VEC - s < d), policy=policy)

    def pair_chunk(c, win, gw, uw, gr, ur, sw, sg, su, orr, tmp, dep, Yf, y_base, c0, d, policy):  # noqa: N803
        """Chunk ``c`` (0 / 1) of a pair: its two aligned vectors out of the three, shifted, activated, stored."""
        vector.copy(win, gw, 2 * _WORDS, 0, c * _WORDS)
        rowwise.shift_down(gr, win, sw, sg)
        vector.copy(win, uw, 2 * _WORDS, 0, c * _WORDS)
        rowwise.shift_down(ur, win, sw, su)
        _act_vector(act, dtype, orr, gr, ur, 0, tmp, dep[0])
        store_chunk(Yf, y_base, c0 + c * _VEC, d, orr, policy)

    def load_source(regs, Xf, x_base, off, c0, s, d, policy):  # noqa: N803
        """``regs[0:8]`` <- the aligned vectors around the chunk at ``c0`` of the source starting ``off``
        elements into the row, ``s`` elements past a boundary; each only where it holds a row element."""
        start = x_base + T.Cast("int64", off) + T.Cast("int64", c0 - s)
        vector.load_v4(regs, 0, Xf.ptr_to([start]), c0 + _VEC - s > 0, policy=policy)
        vector.load_v4(regs, _WORDS, Xf.ptr_to([start + _VEC]), T.And(s > 0, c0 + _VEC - s < d), policy=policy)

    def store_chunk(Yf, y_base, c0, d, orr, policy):  # noqa: N803
        with T.If(rowwise.chunk_inside(c0, d)):
            with T.Then():
                vector.store_v4(Yf.ptr_to([y_base + T.Cast("int64", c0)]), orr, 0, policy=policy)
            with T.Else():  # the row's unaligned head or tail
                rowwise.store_elements(Yf, y_base, c0, d, orr, dtype)

    @T.prim_func
    def act_and_mul(x_ptr: T.handle, y_ptr: T.handle, zero: T.int32):
        M = T.int32()
        d = T.int32()
        x_stride = T.int32()
        y_stride = T.int32()
        Y = T.match_buffer(y_ptr, (M, d), dtype, strides=(y_stride, 1), align=2)
        X = T.match_buffer(x_ptr, (M, 2 * d), dtype, strides=(x_stride, 1), align=2)
        T.device_entry()
        Xf = T.decl_buffer((M * x_stride,), dtype, data=X.data)
        Yf = T.decl_buffer((M * y_stride,), dtype, data=Y.data)
        row_block, seg0 = T.cta_id([(M + (THREADS >> lanes_log2(units(max_chunks(d, y_stride)))) - 1)
                                    >> (8 - lanes_log2(units(max_chunks(d, y_stride)))),
                                    T.min((units(max_chunks(d, y_stride)) + THREADS - 1) // THREADS, MAX_GRID_Y)])
        tid = T.thread_id([THREADS])
        gw = T.alloc_local(((chunks_per_thread + 1) * _WORDS,), "uint32")
        uw = T.alloc_local(((chunks_per_thread + 1) * _WORDS,), "uint32")
        if chunks_per_thread > 1:
            win = T.alloc_local((2 * _WORDS,), "uint32")  # one chunk's two aligned vectors, out of gw / uw
        gr = T.alloc_local((_WORDS,), "uint32")
        ur = T.alloc_local((_WORDS,), "uint32")
        sw = T.alloc_local((6,), "uint32")
        orr = T.alloc_local((_WORDS,), "uint32")
        tmp = T.alloc_local((2 * _WORDS,), "float32")
        dep = T.alloc_local((1,), "uint32")
        k = T.alloc_local((1,), "int32")
        pol = T.alloc_local((access.count,), "uint64")
        access.create(pol)
        pdl_launch.begin(pdl)  # nothing global before this: the previous kernel may still write x or read out

        # Launch geometry (the host computes the same expressions for the grid).
        cmax = units(max_chunks(d, y_stride))
        lg = lanes_log2(cmax, device=True)
        segs = (cmax + THREADS - 1) // THREADS
        grid_y = T.min(segs, MAX_GRID_Y)
        row = row_block * (THREADS >> lg) + (tid >> lg)
        lane = tid & ((1 << lg) - 1)

        # Row geometry: chunks aligned to out's 16-byte boundaries; 64-bit row offsets.
        x_base = T.Cast("int64", row) * T.Cast("int64", x_stride)
        y_base = T.Cast("int64", row) * T.Cast("int64", y_stride)
        ag = rowwise.row_misalign(X.data, x_base)
        ao = rowwise.row_misalign(Y.data, y_base)
        sg = (ag - ao) & 7
        su = (ag + d - ao) & 7
        chunks = (ao + d + 7) >> 3
        # Chunk k of the row: one trip, a second one only where the row has one chunk more than planned (d and
        # out's stride multiples of 8, out's pointer not: lane 0 of segment 0 or of the row takes it) or segments
        # run past grid y (d > 134M).
        k[0] = (seg0 << lg) + lane
        if chunks_per_thread == 1:
            while T.And(row < M, k[0] < chunks):
                c0 = (k[0] << 3) - ao
                load_source(gw, Xf, x_base, 0, c0, sg, d, access.operand(pol, "load"))
                load_source(uw, Xf, x_base, d, c0, su, d, access.operand(pol, "load"))
                # Every word depends on every load (``zero`` is 0): all loads issue before any math.
                dep[0] = vector.after_all(gw, 2 * _WORDS, zero) | vector.after_all(uw, 2 * _WORDS, zero)
                rowwise.shift_down(gr, gw, sw, sg)
                rowwise.shift_down(ur, uw, sw, su)
                _act_vector(act, dtype, orr, gr, ur, 0, tmp, dep[0])
                store_chunk(Yf, y_base, c0, d, orr, access.operand(pol, "store"))
                k[0] = k[0] + (grid_y << lg)
        else:
            # Unit k: chunks 2 k and 2 k + 1 (the second where the row has it).
            while T.And(row < M, k[0] < units(chunks)):
                c0 = (k[0] << 4) - ao
                two = (k[0] << 1) + 1 < chunks
                load_pair_source(gw, Xf, x_base, 0, c0, sg, d, two, access.operand(pol, "load"))
                load_pair_source(uw, Xf, x_base, d, c0, su, d, two, access.operand(pol, "load"))
                dep[0] = vector.after_all(gw, 3 * _WORDS, zero) | vector.after_all(uw, 3 * _WORDS, zero)
                pair_chunk(0, win, gw, uw, gr, ur, sw, sg, su, orr, tmp, dep, Yf, y_base, c0, d,
                           access.operand(pol, "store"))
                if two:
                    pair_chunk(1, win, gw, uw, gr, ur, sw, sg, su, orr, tmp, dep, Yf, y_base, c0, d,
                               access.operand(pol, "store"))
                k[0] = k[0] + (grid_y << lg)
        pdl_launch.end(pdl)

    return pdl_launch.launch(act_and_mul, pdl)
