"""The service's entry point: ``gunicorn receipts.app:app``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from eventbus import create_app
from receipts.handlers import create_router

logger = logging.getLogger("eventbus.receipts")


def log_sender(receipt: Mapping[str, Any]) -> str:
    """Stand-in for an e-mail client: log the receipt."""
    logger.info("receipt to %s for %s", receipt.get("email"), receipt.get("total"))
    return "logged"


app = create_app(create_router(log_sender))
