"""The one place that imports litellm, lazily and configured for offline costs.

litellm takes seconds to import, so nothing imports it at module level: :mod:`.model` calls
:func:`import_litellm` for a provider that is not OpenAI-compatible, and :mod:`.costs` calls it
only to count tokens exactly. Both use this module, so neither imports the other for it.
"""

from __future__ import annotations

import os
from typing import Any

_litellm: Any = None


def import_litellm() -> Any:
    """Import litellm once, configured for offline costs and quiet errors."""
    global _litellm
    if _litellm is None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        # litellm otherwise prints a "Give Feedback / Get Help" banner on every error.
        litellm.suppress_debug_info = True
        _litellm = litellm
    return _litellm
