"""``python -m neffcache.client.cli``: the same as the ``neffcache`` command."""

from __future__ import annotations

import sys

from . import main

sys.exit(main())
