"""``nixl.logging``: NIXL's logger factory, on the standard library's logging
(``NIXL_LOG_LEVEL`` sets the level: TRACE, DEBUG, INFO, WARN, ERROR; INFO by default, to
standard output, as NIXL's)."""

from __future__ import annotations

import logging as _logging
import os
import sys

_LEVELS = {"TRACE": 5, "DEBUG": 10, "INFO": 20, "WARN": 30, "WARNING": 30, "ERROR": 40, "FATAL": 50}


def get_logger(name: str) -> _logging.Logger:
    """A logger under ``nixl`` that prints ``time NIXL LEVEL file:line message``."""
    root = _logging.getLogger("nixl")
    if not root.handlers:
        h = _logging.StreamHandler(sys.stdout)
        h.setFormatter(
            _logging.Formatter(
                "%(asctime)s NIXL %(levelname)-8s %(filename)s:%(lineno)d %(message)s",
                "%Y-%m-%d %H:%M:%S",
            )
        )
        root.addHandler(h)
        root.propagate = False
    level = os.environ.get("NIXL_LOG_LEVEL", "INFO").upper()
    root.setLevel(_LEVELS.get(level, 20))
    return root if name in ("nixl", "") else root.getChild(name.rsplit(".", 1)[-1])
