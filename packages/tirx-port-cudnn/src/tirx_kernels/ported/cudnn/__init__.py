# SPDX-License-Identifier: Apache-2.0
"""TIRx ports of cuDNN Frontend (NVIDIA/cudnn-frontend) (no kernel yet: see the package README)."""
