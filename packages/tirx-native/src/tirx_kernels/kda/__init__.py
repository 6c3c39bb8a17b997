# SPDX-License-Identifier: Apache-2.0
"""Native KDA (Kimi Delta Attention) kernels."""

# The kernel protocol these modules follow (packages/tirx-core/PROTOCOL.md, "Versions"); read by the registry
# without importing, which refuses the package where the installed tirx-core does not speak it.
TIRX_KERNELS_PROTOCOL = 1
