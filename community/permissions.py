"""Every permission codename the project checks, in one place (no Django or DRF import).

The API checks them through the permission classes of ``community.access``; the admin and
the console through ``ModelAdmin.has_*_permission`` and these names.
"""

from __future__ import annotations

# The community layer's records: read or change any user's (a user acts on their own without).
READ_ANY = "community.view_communityleave"
CHANGE_ANY = "community.change_communityleave"
# Erasing anyone but oneself (signals_app.erasure): a permission of its own, not implied by CHANGE_ANY.
ERASE_ANY = "community.erase_communityleave"

# Groups and their members.
ADD_COMMUNITY = "community.add_community"
ADD_COHORT = "community.add_cohort"
VIEW_COHORT = "community.view_cohort"
ADD_COMMUNITY_MEMBER = "community.add_communitymember"
DELETE_COMMUNITY_MEMBER = "community.delete_communitymember"
ADD_COHORT_MEMBER = "community.add_cohortmember"
DELETE_COHORT_MEMBER = "community.delete_cohortmember"

# Signals.
ADD_SIGNALS = "signals_app.add_signal"
READ_ANY_SIGNALS = "signals_app.view_signal"
CHANGE_SIGNALS = "signals_app.change_signal"

# What `manage.py create_service_account` grants by default.
SERVICE_PERMISSIONS = (
    ADD_SIGNALS,
    READ_ANY_SIGNALS,
    READ_ANY,
    CHANGE_ANY,
    ADD_COMMUNITY,
    ADD_COHORT,
    VIEW_COHORT,
    ADD_COMMUNITY_MEMBER,
    DELETE_COMMUNITY_MEMBER,
    ADD_COHORT_MEMBER,
    DELETE_COHORT_MEMBER,
)
