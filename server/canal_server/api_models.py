"""Compatibility: the REST models moved to ``canal_server.api.models``."""

from canal_server.api.models import *  # noqa: F403
from canal_server.api.models import __all__ as __all__
