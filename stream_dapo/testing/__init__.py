"""What tests/ and bench/ share, in one importable place neither reaches across the other for:
`services` (ports, overrides of a small real run, small models and groups), `drills` (the fault and
elastic-fleet drills over real processes), `golden` (one message of every kind, for the wire format),
`hostile` (the verifier's hostile-input corpus). Nothing in the library imports this package."""
