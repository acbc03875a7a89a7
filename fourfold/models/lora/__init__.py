"""LoRA via peft, with one shared base model for every role that adapts it.

* :mod:`~fourfold.models.lora.base`: the settings and the :class:`SharedBase` (one frozen model,
  adapters switched per role, not thread-safe);
* :mod:`~fourfold.models.lora.roles`: the roles over it, :class:`AdapterLM` (policy) and
  :class:`AdapterScalarModel` (critic, reward model: adapter + head), and :func:`add_critic`;
* :mod:`~fourfold.models.lora.files`: their files (adapter and merged directories, the LoRA
  reward-model format) and :func:`load_reward_adapter`.

Which roles are adapters in a run is the role plan's decision (:mod:`fourfold.models.plan`), and
:func:`fourfold.models.build.build_roles` builds them.
"""

from fourfold.models.lora.base import (
    CRITIC,
    POLICY,
    REWARD,
    AdapterConcurrencyError,
    LoraSettings,
    SharedBase,
    adapter_parameters,
)
from fourfold.models.lora.files import (
    SCORE_FILE,
    backbone_prefixes,
    is_adapter_dir,
    is_lora_role,
    load_reward_adapter,
    merged_state_dict,
    merged_tensors,
    rename_target_modules,
    save_adapter,
    save_merged,
    split_reward_state,
)
from fourfold.models.lora.roles import AdapterLM, AdapterScalarModel, add_critic, value_head

__all__ = ["CRITIC", "POLICY", "REWARD", "SCORE_FILE", "AdapterConcurrencyError", "AdapterLM", "AdapterScalarModel",
           "LoraSettings", "SharedBase", "adapter_parameters", "add_critic", "backbone_prefixes", "is_adapter_dir",
           "is_lora_role", "load_reward_adapter", "merged_state_dict", "merged_tensors", "rename_target_modules", "save_adapter",
           "save_merged", "split_reward_state", "value_head"]
