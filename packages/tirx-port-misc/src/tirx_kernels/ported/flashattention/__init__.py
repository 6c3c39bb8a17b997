# SPDX-License-Identifier: Apache-2.0
"""TIRx ports of flash-attention for Hopper: ``flash_attention4`` (the FA3-design forward)."""

# The kernel protocol these modules follow (packages/tirx-core/PROTOCOL.md, "Versions"); read by the registry
# without importing, which refuses the package where the installed tirx-core does not speak it.
TIRX_KERNELS_PROTOCOL = 1
