"""The API's serializers of the community layer: ``layer`` (status, history, changes), ``feed``
(the change feed, the records filter), ``groups`` (communities, cohorts, top items),
``webhooks`` (subscriptions and deliveries)."""
