# SPDX-License-Identifier: Apache-2.0
"""TIRx ports of DeepGEMM (deepseek-ai/DeepGEMM) (no kernel yet: see the package README)."""
