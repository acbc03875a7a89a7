"""`fourfold gym`: PPO / REINFORCE on a discrete-action Gymnasium environment (fourfold.trainers.gym)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Optional

from fourfold.config.loader import require
from fourfold.config.run import RunConfig


@dataclasses.dataclass
class GymEnvConfig:
    """The environment: one vectorised training env and a separate, seeded evaluation env."""

    id: str = "CartPole-v1"
    """Gymnasium id of a discrete-action environment with a flat (Box) observation."""
    num_envs: int = 8
    """Parallel copies stepped together (a SyncVectorEnv); for REINFORCE, episodes per batch."""
    autoreset_mode: Literal["same_step", "next_step"] = "same_step"
    """Gymnasium 1.x vector autoreset. same_step: the step that ends an episode already returns the
    next episode's first observation (the final one is in infos['final_obs']), so every step is a
    real transition. next_step (Gymnasium's default): the step after a done only resets the env;
    that step is kept in the Rollout with mask 0. Both give identical advantages."""
    solved_return: Optional[float] = None
    """Mean greedy-evaluation return that counts as solved (first_solved_step); null: the env's
    registered reward_threshold (CartPole-v1 475, Acrobot-v1 -100)."""
    kwargs: dict = dataclasses.field(default_factory=dict)
    """Extra keyword arguments for gymnasium.make (e.g. {max_episode_steps: 200})."""

    def validate(self, prefix: str = "env") -> None:
        require(bool(self.id), f"{prefix}.id", "must name a Gymnasium environment")
        require(self.num_envs >= 1, f"{prefix}.num_envs", "must be >= 1")


@dataclasses.dataclass
class GymAgentConfig:
    """Actor and critic: two separate MLPs (no shared trunk), orthogonal init."""

    hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [64, 64])
    """Hidden layer widths of each MLP."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation (tanh, as in the PPO paper's MuJoCo/Atari-free setups and CleanRL)."""

    def validate(self, prefix: str = "agent") -> None:
        require(len(self.hidden_sizes) >= 1 and all(h >= 1 for h in self.hidden_sizes),
                f"{prefix}.hidden_sizes", "must be a non-empty list of positive widths")


@dataclasses.dataclass
class GymPPOConfig:
    """PPO with the usual implementation details (those of CleanRL's ppo.py), under the names the
    language-model PPO section (PPOAlgoConfig) gives the same settings."""

    RENAMED: ClassVar[dict[str, tuple[str, str]]] = {
        "anneal_lr": ("lr_schedule", "'linear' for true, 'constant' for false"),
        "gae_lambda": ("lam", ""),
        "num_minibatches": ("minibatch_size", "transitions per minibatch, env.num_envs * num_steps / "
                                              "num_minibatches; null for the whole batch"),
        "update_epochs": ("ppo_epochs", ""),
        "norm_adv": ("whiten_advantages", ""),
        "clip_coef": ("clip_eps", ""),
        "clip_vloss": ("vf_clip_eps", "a clip range, null for none; clip_vloss=true was vf_clip_eps equal to clip_eps"),
        "ent_coef": ("entropy_coef", ""),
    }
    """Keys of earlier versions (CleanRL's names): the loader refuses them, naming the new key."""

    total_timesteps: int = 100_000
    """Budget in environment steps (all envs together); the run always spends all of it unless
    stop_when_solved."""
    num_steps: int = 32
    """Steps per env per rollout: a batch is num_envs * num_steps transitions."""
    lr: float = 1e-3
    """Adam learning rate (Adam eps is adam_eps)."""
    lr_schedule: Literal["linear", "constant"] = "linear"
    """'linear': decay the learning rate linearly from lr to 0 over the run; 'constant': keep lr."""
    gamma: float = 0.98
    """Discount factor."""
    lam: float = 0.8
    """GAE lambda (1 = Monte-Carlo returns minus V, 0 = one-step TD)."""
    minibatch_size: Optional[int] = None
    """Transitions per optimizer step; it must divide the batch env.num_envs * num_steps, which is
    split into batch / minibatch_size shuffled minibatches each epoch. null: the whole batch."""
    ppo_epochs: int = 20
    """Passes over each batch."""
    whiten_advantages: bool = True
    """Whiten advantages per minibatch (mean 0, std 1)."""
    clip_eps: float = 0.2
    """Clip range of the probability ratio in the surrogate objective."""
    vf_clip_eps: Optional[float] = None
    """Clip range of the value update around the rollout's values (PPO2-style clipped value loss);
    null = plain MSE."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus in the policy loss."""
    vf_coef: float = 0.5
    """Value loss coefficient (the value loss already carries a factor 0.5)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip over actor and critic parameters together."""
    target_kl: Optional[float] = None
    """Stop the epochs of an update early once approx_kl exceeds this (null: never)."""
    adam_eps: float = 1e-5
    """Adam epsilon (1e-5 rather than torch's 1e-8, as in the reference implementations)."""

    def validate(self, prefix: str = "ppo") -> None:
        require(self.total_timesteps >= 1, f"{prefix}.total_timesteps", "must be >= 1")
        require(self.num_steps >= 1, f"{prefix}.num_steps", "must be >= 1")
        require(self.lr > 0, f"{prefix}.lr", "must be > 0")
        require(0 < self.gamma <= 1, f"{prefix}.gamma", "must be in (0, 1]")
        require(0 <= self.lam <= 1, f"{prefix}.lam", "must be in [0, 1]")
        require(self.minibatch_size is None or self.minibatch_size >= 1, f"{prefix}.minibatch_size",
                "must be >= 1 or null")
        require(self.ppo_epochs >= 1, f"{prefix}.ppo_epochs", "must be >= 1")
        require(self.clip_eps > 0, f"{prefix}.clip_eps", "must be > 0")
        require(self.vf_clip_eps is None or self.vf_clip_eps > 0, f"{prefix}.vf_clip_eps", "must be > 0 or null")
        require(self.entropy_coef >= 0, f"{prefix}.entropy_coef", "must be >= 0")
        require(self.vf_coef >= 0, f"{prefix}.vf_coef", "must be >= 0")
        require(self.max_grad_norm > 0, f"{prefix}.max_grad_norm", "must be > 0")
        require(self.target_kl is None or self.target_kl > 0, f"{prefix}.target_kl", "must be > 0 or null")
        require(self.adam_eps > 0, f"{prefix}.adam_eps", "must be > 0")


@dataclasses.dataclass
class GymReinforceConfig:
    """REINFORCE: no critic, no clipping; one gradient step per batch of env.num_envs complete
    episodes, each step's weight the Monte-Carlo return from that step on."""

    total_timesteps: int = 100_000
    """Budget in environment steps of the complete episodes used for learning."""
    lr: float = 1e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor of the returns."""
    baseline: Literal["none", "mean"] = "mean"
    """'mean': subtract the batch mean return (a variance reduction that keeps the gradient
    essentially unbiased); 'none': plain REINFORCE."""
    max_grad_norm: Optional[float] = None
    """Global gradient-norm clip (null: none, the textbook algorithm)."""
    adam_eps: float = 1e-5
    """Adam epsilon."""

    def validate(self, prefix: str = "reinforce") -> None:
        require(self.total_timesteps >= 1, f"{prefix}.total_timesteps", "must be >= 1")
        require(self.lr > 0, f"{prefix}.lr", "must be > 0")
        require(0 < self.gamma <= 1, f"{prefix}.gamma", "must be in (0, 1]")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, f"{prefix}.max_grad_norm",
                "must be > 0 or null")
        require(self.adam_eps > 0, f"{prefix}.adam_eps", "must be > 0")


@dataclasses.dataclass
class GymEvalConfig:
    """Greedy (argmax) evaluation on a separate env, seeded the same way at every evaluation."""

    every_steps: int = 5_000
    """Evaluate each time the env-step count crosses a multiple of this (and at the end); 0: only
    at the end."""
    episodes: int = 10
    """Episodes per evaluation (run in parallel, one per eval env)."""
    seed_offset: int = 10_000
    """Eval episode i starts from seed run.seed + seed_offset + i (same start states every time)."""

    def validate(self, prefix: str = "eval") -> None:
        require(self.every_steps >= 0, f"{prefix}.every_steps", "must be >= 0")
        require(self.episodes >= 1, f"{prefix}.episodes", "must be >= 1")
        require(self.seed_offset >= 0, f"{prefix}.seed_offset", f"must be >= 0, got {self.seed_offset}")


@dataclasses.dataclass
class GymConfig:
    """`fourfold gym`: PPO or REINFORCE on a Gymnasium environment (see docs/gym.md)."""

    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/gym", threads=1))
    """Run directory, seed, threads (1 is fastest for these tiny MLPs), checkpoints."""
    algo: Literal["ppo", "reinforce"] = "ppo"
    """Which agent to train."""
    env: GymEnvConfig = dataclasses.field(default_factory=GymEnvConfig)
    """The environment."""
    agent: GymAgentConfig = dataclasses.field(default_factory=GymAgentConfig)
    """Network shapes."""
    ppo: GymPPOConfig = dataclasses.field(default_factory=GymPPOConfig)
    """PPO settings (read when algo is ppo)."""
    reinforce: GymReinforceConfig = dataclasses.field(default_factory=GymReinforceConfig)
    """REINFORCE settings (read when algo is reinforce)."""
    eval: GymEvalConfig = dataclasses.field(default_factory=GymEvalConfig)
    """Evaluation schedule."""
    stop_when_solved: bool = False
    """End the run at the first evaluation whose mean return reaches the solved threshold."""

    def validate(self, prefix: str = "") -> None:
        batch = self.env.num_envs * self.ppo.num_steps
        if self.ppo.minibatch_size is not None:
            require(batch % self.ppo.minibatch_size == 0, "ppo.minibatch_size",
                    f"{self.ppo.minibatch_size} does not divide the batch env.num_envs * ppo.num_steps = {batch}")
        if self.algo == "ppo":
            require(self.ppo.total_timesteps >= batch, "ppo.total_timesteps",
                    f"must be at least one batch (env.num_envs * ppo.num_steps = {batch})")

    @property
    def num_minibatches(self) -> int:
        """PPO minibatches per epoch: env.num_envs * ppo.num_steps / ppo.minibatch_size (1 when null)."""
        if self.ppo.minibatch_size is None:
            return 1
        return self.env.num_envs * self.ppo.num_steps // self.ppo.minibatch_size
