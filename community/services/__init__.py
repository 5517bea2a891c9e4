"""Writes to the community layer (no DRF here: views and serializers shape the answers).

- ``layer``: leave, rejoin (one user or many) and an erasure's leave. Each change runs in
  one transaction that locks the leave clock first (so versions are handed out and
  committed in order), writes the new record, and appends its history row keyed by the
  new version.
- ``rebuild``: validate every record and make every process re-warm its leave cache.
- ``groups``: communities and cohorts, their members.
- ``membership_import``: memberships from ``kind,slug,user_id`` lines.
- ``service_accounts``: an account with exactly the permissions it needs, and its token.
"""
