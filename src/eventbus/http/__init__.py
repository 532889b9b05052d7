"""Outbound HTTP with a total deadline: what partner calls and push authentication use.

* ``deadline``: ``Client`` and ``request`` on requests/urllib3: a call ends within its
  total deadline however slowly the other side answers, with a cap on the answer's size;
* ``deadline_async``: the same for async code, on httpx;
* ``retry_after``: a partner's ``Retry-After`` header, read (seconds or an HTTP date).

May import: the standard library, ``eventbus.model``, requests/urllib3 and httpx.
"""
