"""fourfold.models.

* :mod:`fourfold.models.loading` - tokenizers and HF models from directories, devices and dtypes.
* :mod:`fourfold.models.roles` - the four roles (policy log-probs, frozen reference, scalar reward/critic).
* :mod:`fourfold.models.factory` - small random Llama models for tests and from-scratch runs.
* :mod:`fourfold.models.reward_fn` - :func:`load_reward_fn`, a user's reward function named in a config.
"""

from fourfold.models.reward_fn import load_reward_fn

__all__ = ["load_reward_fn"]
