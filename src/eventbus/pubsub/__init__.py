"""The Google-specific edges: the push envelope, push authentication, the publisher.

* ``envelope``: a push request (wrapped, unwrapped, CloudEvent) → ``Delivery``;
* ``push_auth``: verifies the OIDC token Pub/Sub signs (google-auth, requests);
* ``message``: the standard message, built and validated without any client;
* ``publisher``: google-cloud-pubsub; ``publish()`` for other services.

May import: ``eventbus.model``, ``eventbus.settings``, ``eventbus.http``; Google's clients.
Never Flask, pymongo, the store or the processor. Importing this package
imports none of its modules, so a publisher needs only google-cloud-pubsub:
``message`` and ``publisher`` take what they need of the settings from
``eventbus.settings_base`` (the standard library), never from ``eventbus.settings``
(pydantic), which ``publisher`` names for types only.
"""
