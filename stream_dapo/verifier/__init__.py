"""Math answer verifier: extract the final answer, normalise it, compare it with the gold answer.

``verify`` runs in-process; ``VerifierPool`` runs it in worker processes with a wall-clock timeout
per check, which is what generators use. Model text is never executed: see ``safe_parse``.
Importing this package is light (no sympy, no torch) so that pool workers start fast.
"""

from stream_dapo.verifier.core import REASONS, VerifyResult, verify
from stream_dapo.verifier.pool import VerifierPool

__all__ = ["REASONS", "VerifierPool", "VerifyResult", "verify"]
