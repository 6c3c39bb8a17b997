# SPDX-License-Identifier: Apache-2.0
"""TIRx ports of DeepEP's intranode (NVLink) expert-parallel communication for Hopper: ``deepep_dispatch`` (tokens to
the ranks that own their top-k experts) and ``deepep_combine`` (the expert outputs summed back to the source tokens)."""

# The kernel protocol these modules follow (packages/tirx-core/PROTOCOL.md, "Versions"); read by the registry
# without importing, which refuses the package where the installed tirx-core does not speak it.
TIRX_KERNELS_PROTOCOL = 1
