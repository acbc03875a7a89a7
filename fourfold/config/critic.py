"""The critic's keys of the language-model RL stages: `model.critic_init` is read only where a
critic is loaded (PPO's `advantage: gae` with `use_critic`), so it is refused with a critic-free
estimator (grpo, dr_grpo, rloo, reinforce_pp) and in `fourfold reinforce`; its default, null, is
resolved here to the start the role plan reads ('reward' beside a reward model, else 'policy')."""

from __future__ import annotations

from fourfold.config.loader import require


def critic_start(model) -> str:
    """Where the critic starts: ``model.critic_init``, or for the default (null) 'reward' beside a
    reward model and 'policy' without one (the rule validation resolves the key by, and the role
    plan reads when a config was built without validation)."""
    if model.critic_init is not None:
        return model.critic_init
    return "reward" if model.reward is not None else "policy"


def require_critic_init(model, algo, env_run: bool = False) -> None:
    """``model.critic_init`` only where a critic is loaded (``algo`` None: REINFORCE, which has
    none), 'reward' only beside a reward model; then its default (null) resolved in place: 'reward'
    with model.reward, else 'policy', so the role plan reads one of the two."""
    if algo is None or not algo.loads_critic:
        what = "fourfold reinforce has no critic" if algo is None else \
            f"ppo.advantage={algo.advantage} has no critic" if algo.advantage == algo.estimator else \
            f"ppo.advantage={algo.advantage} with use_critic=false ({algo.estimator}) has no critic"
        require(model.critic_init is None, "model.critic_init", f"set to {model.critic_init!r}, and {what}: leave it unset")
        return
    if model.critic_init == "reward" and model.reward is None and model.critic is None:
        require(not env_run, "model.critic_init",
                "'reward' needs model.reward, which this environment run has none of; use critic_init=policy")
        require(False, "model.critic_init",
                "'reward' needs model.reward; use critic_init=policy with a reward function or a reward server")
    model.critic_init = critic_start(model)
