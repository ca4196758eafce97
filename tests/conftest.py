"""Shared pytest setup: litellm works offline, and the support fixtures are registered."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tests.support.fixtures import *  # noqa: F403
