"""The API of the community layer: ``layer`` (a user's status, leave, rejoin, history, bulk
leave), ``feed`` (the change feed, the records list and export), ``groups`` (communities and
cohorts), ``leave_cache`` (this process's cache), ``webhooks`` (subscriptions), ``user_ids``
(the ``{user_id}`` path rule)."""
