"""``python -m cantata.sdk.cli``: the ``cantata`` command."""

import sys

from cantata.sdk.cli.app import main

sys.exit(main())
