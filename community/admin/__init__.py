"""The community layer's admin: ``records`` (the leave records), ``history`` (the leave
history), ``groups`` (communities, cohorts, members), ``webhooks`` (subscriptions and
deliveries), and what they share in ``common``. Importing this package registers them all
(Django's admin autodiscovery imports it)."""

from django.contrib import admin

from . import groups, history, records, webhooks  # noqa: F401 - importing them registers them

# The admin index gains a link to the operators' console (admin/community/site_index.html
# extends the stock index). Set on the default site rather than a custom AdminSite, which
# would mean changing the project's URLconf and INSTALLED_APPS.
admin.site.index_template = "admin/community/site_index.html"
