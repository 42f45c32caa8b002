"""`python -m stream_dapo.cli ...` is `stream-dapo ...`."""

import sys

from stream_dapo.cli import main

sys.exit(main())
