"""Entry point of the learner service: `python services/learner.py --config FILE [--set k=v ...]`.

Equivalent to `stream-dapo learner ...`; systemd units and Kubernetes manifests call this file.
"""

import sys

from stream_dapo.cli import main

if __name__ == "__main__":
    sys.exit(main(["learner", *sys.argv[1:]]))
