"""fourfold: the classic four-model RLHF stack, from zero.

Importing the package has no side effects: no threads are set, no seeds are touched, nothing is
downloaded. Subpackages are imported explicitly (``from fourfold.core import gae``).
"""

__version__ = "0.1.0"
