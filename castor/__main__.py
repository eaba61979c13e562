"""``python -m castor`` is the ``castor`` command."""

import sys

from castor.cli import main

sys.exit(main())
