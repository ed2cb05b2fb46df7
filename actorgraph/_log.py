"""The `actorgraph` logger: quiet unless the application configures logging."""

from __future__ import annotations

import logging

logger = logging.getLogger("actorgraph")
# A library never decides where its records go; without this, warnings would reach
# stderr through logging's last-resort handler.
logger.addHandler(logging.NullHandler())
