"""``python -m hotwire.control_api.cli``: the ``hotwire`` command."""

import sys

from .main import main

sys.exit(main())
