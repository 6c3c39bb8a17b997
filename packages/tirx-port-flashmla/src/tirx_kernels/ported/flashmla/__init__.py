# SPDX-License-Identifier: Apache-2.0
"""TIRx ports of FlashMLA (deepseek-ai/FlashMLA) (no kernel yet: see the package README)."""
