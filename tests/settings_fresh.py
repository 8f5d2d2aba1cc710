"""The test settings as a fresh project has them: no ``LOGGING`` (Django's defaults
only), for the tests of the logging ``runworker`` sets up by itself."""

from tests.settings import *  # noqa: F403

LOGGING: dict[str, object] = {}
