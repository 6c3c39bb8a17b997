# SPDX-License-Identifier: Apache-2.0
"""TIRx ports of DeepGEMM (deepseek-ai/DeepGEMM) for sm_90a: ``fp8_gemm_nt`` (SM90 1d2d and, recipe (1, 1, 128),
1d1d), the m-grouped MoE GEMMs (``m_grouped_fp8_gemm_nt_contiguous``, ``m_grouped_fp8_gemm_nt_masked``) and the
k-grouped wgrad GEMM (``k_grouped_fp8_gemm_nt_contiguous``) on its mainloop, and the FP8 input casts
(``per_token_cast_to_fp8``, ``per_block_cast_to_fp8``); the package README maps each kernel to its upstream entry
point."""

# The kernel protocol these modules follow (packages/tirx-core/PROTOCOL.md, "Versions"); read by the registry
# without importing, which refuses the package where the installed tirx-core does not speak it.
TIRX_KERNELS_PROTOCOL = 1
