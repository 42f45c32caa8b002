"""Process exit codes of every `stream-dapo` command, so supervisors can tell what to do.

| code | meaning | what a supervisor should do |
|---|---|---|
| 0 | finished, or drained after SIGTERM | nothing |
| 1 | failed while running (e.g. the journal could not be written, a weight update failed) | restart; look at the log if it repeats |
| 2 | bad configuration, usage or files: restarting cannot help | stop; fix the config named in the log |
| 69 | a peer (buffer, learner weight server) did not answer at start-up | restart after a delay: the peer may still be starting |
| 130 | interrupted (Ctrl-C) | nothing |

69 is `EX_UNAVAILABLE` of sysexits.h. systemd units list 2 in `RestartPreventExitStatus` and restart
on 1 and 69 with back-off; Kubernetes restarts every non-zero exit, so a config error shows as
CrashLoopBackOff with the fix in the log.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1
    CONFIG = 2
    PEER_UNAVAILABLE = 69
    INTERRUPTED = 130
