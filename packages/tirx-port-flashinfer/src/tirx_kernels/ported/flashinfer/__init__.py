# SPDX-License-Identifier: Apache-2.0
"""TIRx ports of FlashInfer kernels, by FlashInfer entry point (activation, ...)."""
