"""The default handoff policy, in Python.

Every event but an invalidation is handed off to the outbox under the baseline's event ID, the
lowercase hex SHA-256 of its resume token's canonical text; the run loop (resume mode, one atomic
commit per event, invalidations, the idle watermark, the report) is the SDK's, handoff_policy.
"""

import handoff_policy as handoff


def decide(event):
    """Hands every event off under its baseline ID."""
    return handoff.hand_off(event.id)
