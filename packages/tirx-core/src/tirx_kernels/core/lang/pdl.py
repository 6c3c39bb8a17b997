# SPDX-License-Identifier: Apache-2.0
"""Programmatic dependent launch (PDL, sm_90+): let a kernel's CTAs launch while the kernel before it on the
stream is still finishing, and wait in the kernel, not in the launch queue.

A kernel launched with the ``programmaticStreamSerializationAllowed`` attribute (:func:`enable` on the
prim_func: TIRx's host wrapper then sets it) may start as soon as every CTA of the previous kernel on the stream
has exited or executed ``griddepcontrol.launch_dependents`` (:func:`launch_dependents`). Its own
``griddepcontrol.wait`` (:func:`wait`) then blocks until that previous grid has *completed* and its memory
operations are visible; so the rule of a PDL kernel is: **every thread executes** :func:`wait` **before its first
global-memory access** (a read of an input the previous kernel wrote, or a write to a buffer it still reads).
What may come before it: index arithmetic, ``createpolicy``, shared-memory setup. What PDL buys is the CTA
launch and that prologue, overlapped with the previous kernel's tail: for back-to-back microsecond kernels
(a CUDA graph of a decoder layer) that is a large share of each kernel's time.

Where the previous kernel never calls ``launch_dependents`` (any non-PDL kernel) the dependent launches when that
kernel's CTAs have exited, as without PDL; correctness never depends on where ``launch_dependents`` sits, only on
:func:`wait`. Calling it early lets the next kernel's CTAs become resident (and block in their ``wait``) while
this one still runs: harmless for a grid that is entirely resident, but in a multi-wave grid they would take
SM slots from this kernel's later waves, so such kernels call it after their last stores.

Helpers emit through ``T.evaluate`` (a bare ``T.ptx.*`` call in a traced helper is dropped).
"""

from __future__ import annotations

from tvm.script import tirx as T

# TIRx's launch-parameter tag (spelled as TIRx spells it) that makes the host wrapper add the launch attribute.
LAUNCH_TAG = "tirx.use_programtic_dependent_launch"
# A kernel's ``pdl`` compile param (``begin`` / ``end`` / ``launch``): "end" calls ``launch_dependents`` after
# the kernel's last global store, "early" right after ``wait``; None: PDL off (a plain launch).
TRIGGERS = ("end", "early")


def wait():
    """Block until the previous kernel on the stream has completed and its writes are visible
    (``griddepcontrol.wait``; returns at once when the kernel was not launched as a PDL dependent)."""
    T.evaluate(T.ptx.griddepcontrol.wait())


def launch_dependents():
    """Allow the next kernel on the stream to launch once every CTA of this grid has executed this or exited
    (``griddepcontrol.launch_dependents``; a no-op for a next kernel launched without PDL)."""
    T.evaluate(T.ptx.griddepcontrol.launch_dependents())


def check_trigger(kernel: str, trigger) -> None:
    """A kernel's ``pdl`` compile param: None (off) or one of ``TRIGGERS``."""
    if trigger is not None and trigger not in TRIGGERS:
        raise ValueError(f"{kernel}: pdl {trigger!r} is not None or one of {TRIGGERS}")


def begin(trigger) -> None:
    """A kernel body's PDL prologue for its ``pdl`` compile param ``trigger`` (None: nothing): :func:`wait`, and
    for "early" :func:`launch_dependents` right after it. Call it after the shared-memory / barrier setup and
    before the first global access, in code every thread runs."""
    if trigger is not None:
        wait()
        if trigger == "early":
            launch_dependents()


def end(trigger) -> None:
    """A kernel body's PDL epilogue: :func:`launch_dependents` after the last global store, for trigger "end"."""
    if trigger == "end":
        launch_dependents()


def launch(func, trigger, *, cluster: bool = False):
    """``func`` launched as ``trigger`` says: unchanged for None, else :func:`enable`-d."""
    return func if trigger is None else enable(func, cluster=cluster)


def enable(func, *, cluster: bool = False):
    """``func`` (a prim_func whose kernel binds ``blockIdx.x`` [``clusterCtaIdx.x``] and ``threadIdx.x``, and
    which executes :func:`wait` first) launched with the PDL attribute: the explicit launch-parameter list,
    which otherwise SplitHostDevice infers, plus :data:`LAUNCH_TAG`. ``tirx.use_dyn_shared_memory`` is always
    listed; the wrapper passes 0 bytes for a kernel without dynamic shared memory."""
    tags = ["blockIdx.x", *(["clusterCtaIdx.x"] if cluster else []), "threadIdx.x", LAUNCH_TAG,
            "tirx.use_dyn_shared_memory"]
    return func.with_attr("tirx.kernel_launch_params", tags)
