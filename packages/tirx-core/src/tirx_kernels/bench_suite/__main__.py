# SPDX-License-Identifier: Apache-2.0
"""``python -m tirx_kernels.bench_suite``: see ``cli.main``."""

import sys

from .cli import main

sys.exit(main())
