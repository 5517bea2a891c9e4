"""Webhook delivery: every change, to every subscriber, in version order, at least once, signed.

How it works (README, "Webhooks"):

- Each subscriber has a cursor, ``acked_version``: every change up to it was answered with
  a 2xx (or is of an action it does not want).
- A delivery (``webhook_deliver``) claims the subscriber with a lease (a conditional UPDATE,
  so two workers never send to one subscriber at once and order holds, on PostgreSQL and
  SQLite alike), reads up to ``WEBHOOK_BATCH_SIZE`` history rows after the cursor in version
  order, sends the wanted ones as one signed message (Standard Webhooks), and moves the
  cursor past them only on a 2xx. No transaction is held while the HTTP exchange runs, so
  a slow receiver never holds a lock a leave needs. A worker killed mid-send leaves a lease
  that expires (``lease_seconds``) and another worker takes over: the batch is sent again
  (at least once; receivers deduplicate by ``version``).
- A failure sets ``next_attempt_at`` by exponential back-off with jitter; nobody sends
  before it. A subscriber failing with no success for ``WEBHOOK_PAUSE_AFTER_SECONDS`` is
  paused.
- A change's transaction only registers ``kick_webhooks`` on commit; it never raises, so a
  broker that is down never fails a leave. Beat's ``sweep_webhooks`` wakes every lagging
  subscriber, so a lost kick delays a delivery and loses nothing.
- Targets are checked against server-side request forgery at send time, after name
  resolution, and the connection goes to the address that was checked (no second look-up
  that DNS rebinding could answer differently).

Where: ``subscriptions`` creates and changes subscribers; ``delivery`` sends one batch to
one subscriber (lease, send, cursor, back-off); ``sending`` builds the signed message and
runs the HTTP exchange; ``ssrf`` decides which targets may be called; ``waking`` queues the
deliveries (the kick after a change, the chain, the sweep); ``lag`` says how far behind each
subscriber is (the admin, the API, /metrics).
"""
