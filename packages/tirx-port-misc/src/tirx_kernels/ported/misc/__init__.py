# SPDX-License-Identifier: Apache-2.0
"""TIRx ports of flash-attention, DeepEP, fast.cu and MSA (no kernel yet: see the package README)."""
