# SPDX-License-Identifier: Apache-2.0
"""Warp-specialized roles: which warpgroup does what, and the register split between them.

A Hopper warp-specialized kernel runs ``1 + num_consumers`` warpgroups of 128 threads: warpgroup 0 is
the producer (one elected thread issues TMA; the other 127 idle), the rest are math warpgroups that own
the accumulators. ``setmaxnreg`` moves registers from the producer to the consumers after launch: the
kernel is compiled for ``65536 / threads`` registers a thread (170 -> 168 for 384 threads, which
``__launch_bounds__(384, 1)`` tells ptxas), then the producer gives most back (``dec`` to 40) and each
consumer takes them (``inc`` to 232). ptxas ignores setmaxnreg with warning C7508 when it cannot prove
the launch bounds: the build treats C7508 as an error.

Ping-pong consumers (each math warpgroup a whole tile, alternate tiles) take turns through named barriers
(:func:`wait_turn` / :func:`pass_turn`: ``bar.sync`` / ``bar.arrive`` of ``core.lang.cluster`` over the two
warpgroups involved).

Helpers emit through ``T.evaluate`` (a bare ``T.ptx.*`` call in a traced helper is dropped).
"""

from __future__ import annotations

from tvm.script import tirx as T

from tirx_kernels.core.lang import cluster

WARPGROUP = 128
REGISTER_FILE = 65536  # 32-bit registers per SM
PRODUCER_REGS = 40
CONSUMER_REGS = 232


def _check(nreg: int):
    if nreg % 8 or not 24 <= nreg <= 256:
        raise ValueError(f"setmaxnreg: {nreg} must be a multiple of 8 in [24, 256]")


def launch_registers(threads_per_cta: int, ctas_per_sm: int = 1) -> int:
    """Registers a thread gets at launch under ``__launch_bounds__(threads, ctas_per_sm)``: the register file
    shared out, in units of 8, at most 255 (168 for 384 threads)."""
    return min(255, REGISTER_FILE // (threads_per_cta * ctas_per_sm) // 8 * 8)


def register_split_fits(num_consumers: int, producer: int = PRODUCER_REGS, consumer: int = CONSUMER_REGS,
                        ctas_per_sm: int = 1) -> bool:
    """Whether the post-``setmaxnreg`` split fits what the CTA was launched with.

    ``setmaxnreg.inc`` takes registers only from the CTA's pool, which holds what ``setmaxnreg.dec`` released
    (PTX ISA: it "blocks the execution until enough registers are available in the CTA's register pool"), so
    the bound is the CTA's launch allocation, ``warpgroups x 128 x launch_registers``, not the register file:
    with 384 threads 40 + 2 x 232 = 24 + 2 x 240 = 3 x 168 fit exactly, while 32 + 2 x 240 (512 x 128 =
    65 536, the whole file) would leave the consumers waiting in ``setmaxnreg.inc`` forever."""
    _check(producer)
    _check(consumer)
    warpgroups = 1 + num_consumers
    return producer + num_consumers * consumer <= warpgroups * launch_registers(warpgroups * WARPGROUP, ctas_per_sm)


def setmaxnreg_dec(nreg: int = PRODUCER_REGS):
    """Release registers down to ``nreg`` per thread (whole warpgroup, warp-uniform)."""
    _check(nreg)
    T.evaluate(T.ptx["setmaxnreg.dec.sync.aligned.u32"](nreg))


def setmaxnreg_inc(nreg: int = CONSUMER_REGS):
    """Wait for and take registers up to ``nreg`` per thread (whole warpgroup, warp-uniform)."""
    _check(nreg)
    T.evaluate(T.ptx["setmaxnreg.inc.sync.aligned.u32"](nreg))


def producer_role(nreg: int = PRODUCER_REGS):
    """Start of the producer warpgroup's branch."""
    setmaxnreg_dec(nreg)


def consumer_role(wg, tid, nreg: int = CONSUMER_REGS):
    """Start of a math warpgroup's branch (``wg`` >= 1 from ``T.warpgroup_id``, ``tid`` the CTA thread id).
    Returns ``(index, thread, warp, lane)``: the consumer's index from 0, its thread id 0..127 inside the
    warpgroup, warp 0..3 and lane 0..31."""
    setmaxnreg_inc(nreg)
    ct = tid - WARPGROUP * wg
    return wg - 1, ct, ct // 32, ct % 32


# ---------------------------------------------------------------------------------------------------------
# Turn-taking between math warpgroups (ping-pong): named barriers first_bar .. first_bar + num_consumers - 1
# ---------------------------------------------------------------------------------------------------------

def _check_turn_bars(first_bar: int, num_consumers: int):
    if first_bar < 1 or first_bar + num_consumers > 16:
        raise ValueError(f"turn barriers {first_bar}..{first_bar + num_consumers - 1} must lie in 1..15")


def wait_turn(first_bar: int, consumer, num_consumers: int = 2):
    """Math warpgroup ``consumer`` (0-based, a Python int or warp-uniform TIR value) waits for its turn:
    ``bar.sync`` on named barrier ``first_bar + consumer``, which completes once the previous consumer in
    turn order has called :func:`pass_turn` (one warpgroup on each side: ``2 x 128`` threads).

    A named barrier has no phases: a ``pass_turn`` not matched by a ``wait_turn`` before the same warpgroup
    passes again would complete it alone. Strict turn-taking rules that out (a consumer passes at most once
    before it waits for its own turn again); keep the counts matched too: the first consumer skips its first
    wait, and the last turn is not passed (``gemm/_pingpong.py``)."""
    _check_turn_bars(first_bar, num_consumers)
    cluster.named_sync(first_bar + consumer, 2 * WARPGROUP)


def pass_turn(first_bar: int, consumer, num_consumers: int = 2):
    """Math warpgroup ``consumer`` hands the turn to the next one: ``bar.arrive`` on its turn barrier."""
    _check_turn_bars(first_bar, num_consumers)
    cluster.named_arrive(first_bar + (consumer + 1) % num_consumers, 2 * WARPGROUP)
