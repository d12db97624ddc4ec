"""Server settings under the quality gate: ``harvest compare`` (candidates against a reference)
and ``harvest tune`` (a grid swept for throughput, each point gated)."""
