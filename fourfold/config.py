"""Typed, validated configs: dataclasses loaded from YAML with command-line overrides.

Convention (one for every subcommand):

    fourfold ppo --config examples/ppo.yaml ppo.kl_coef=0.02 run.seed=3

* A config is a dataclass whose fields are plain values or nested dataclasses (sections).
* YAML gives a mapping of the same shape; ``section.key=value`` overrides are applied after the
  file, values parsed as YAML scalars (``1e-5``, ``true``, ``null``, ``[1, 2]``).
* Every field has a docstring-style comment in its class; unknown keys are refused with a
  "did you mean" suggestion, wrong types name the key and the type expected, and each stage's
  ``validate()`` checks derived sizes once, before any model is loaded.

This module imports only the standard library and PyYAML.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, TypeVar, Union

from fourfold.errors import ConfigError

T = TypeVar("T")

__all__ = [
    "ConfigError",
    "load_config",
    "config_from_dict",
    "config_to_dict",
    "save_config",
    "apply_overrides",
    "require",
    "validate_tree",
    "RunConfig",
]


def require(condition: bool, key: str, message: str) -> None:
    """Raise ConfigError(f"{key}: {message}") unless condition holds (used by validate())."""
    if not condition:
        raise ConfigError(f"{key}: {message}")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple, Sequence):
        args = typing.get_args(tp)
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    """Check/convert one YAML value to the annotated type, or raise ConfigError naming the key."""
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{where}{key}: expected {_type_name(tp)}, got {value!r}")
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}{key}: expected a mapping (section), got {value!r}")
        return _build(tp, value, prefix=key + ".", where=where)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, where)
            except ConfigError:
                continue
        raise bad
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise bad
    if origin in (list, tuple, Sequence):
        if not isinstance(value, (list, tuple)):
            raise bad
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{key}[{i}]", where) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):  # YAML reads "1e-5" as a string
                try:
                    return float(value)
                except ValueError:
                    raise bad from None
            raise bad
        return float(value)
    if tp is str:
        if isinstance(value, (str, Path)):
            return str(value)
        raise bad
    return value


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _build(cls: type[T], data: dict, prefix: str = "", where: str = "") -> T:
    hints = typing.get_type_hints(cls)
    fields = _fields(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{where}{prefix}{key}: unknown key{hint}; known keys here: {known}")
        f = fields[key]
        if isinstance(value, dict) and dataclasses.is_dataclass(hints[key]) and f.default_factory is not dataclasses.MISSING:
            # a partial section keeps this stage's defaults for the keys it does not name
            value = _merge(dataclasses.asdict(f.default_factory()), value)
        kwargs[key] = _coerce(value, hints[key], prefix + key, where)
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{where}{prefix.rstrip('.') or cls.__name__}: {e}") from None


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[parts[-1]] = value


def apply_overrides(tree: dict, overrides: Sequence[str]) -> dict:
    """Apply ``a.b=value`` strings to a nested dict (values parsed as YAML scalars)."""
    import yaml

    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. ppo.kl_coef=0.02")
        key, raw = item.split("=", 1)
        key = key.strip().lstrip("-")
        if not key:
            raise ConfigError(f"override {item!r}: empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(tree, key, value)
    return tree


def config_to_dict(cfg: Any) -> dict:
    """The config as plain nested dicts (for YAML and for cache keys)."""
    return dataclasses.asdict(cfg)


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def config_from_dict(cls: type[T], data: dict, where: str = "") -> T:
    """Build and validate ``cls`` from a nested mapping."""
    cfg = _build(cls, data or {}, where=where)
    try:
        validate_tree(cfg)
    except ConfigError as e:
        raise ConfigError(f"{where}{e}") from None
    return cfg


def validate_tree(cfg: Any, prefix: str = "") -> None:
    """Call ``validate(prefix)`` on every nested section first, then on ``cfg`` itself.

    A section's ``validate(prefix)`` checks its own fields and names them ``prefix.key``; a stage
    config's ``validate("")`` checks combinations across sections (e.g. minibatch vs batch).
    """
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate_tree(value, f"{prefix}.{f.name}" if prefix else f.name)
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        validate(prefix)


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = (), base: dict | None = None
) -> T:
    """Load ``cls`` from an optional YAML file, then ``key=value`` overrides, then validate.

    Errors name the file and the dotted key: ``examples/ppo.yaml: ppo.kl_coeff: unknown key (did
    you mean 'ppo.kl_coef'?)``.
    """
    import yaml

    tree: dict = dict(base or {})
    where = ""
    if path is not None:
        path = Path(path)
        where = f"{path}: "
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}:{line} invalid YAML ({getattr(e, 'problem', e)})") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level, got {type(loaded).__name__}")
        tree = _merge(tree, loaded)
    if overrides:
        tree = apply_overrides(tree, overrides)
        where = where or "command line: "
    return config_from_dict(cls, tree, where=where)


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically: temp file then rename)."""
    import yaml

    from fourfold.atomic import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


# ---------------------------------------------------------------------------------------------
# Shared sections. Stage configs (SFT, reward, PPO, REINFORCE, gym, demo) follow below; each
# field carries its meaning in the comment under it.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunConfig:
    """Where and how a run executes (shared by every stage)."""

    output_dir: str = "runs/run"
    """Run directory: resolved config, metrics.jsonl, checkpoints and outputs go here."""
    seed: int = 0
    """Seed for python, torch (CPU and CUDA) and data order; set explicitly by each trainer."""
    device: str = "auto"
    """'cpu', 'cuda', 'cuda:N' or 'auto' (cuda when available)."""
    threads: Optional[int] = None
    """torch intra-op threads; null leaves torch's default. Tiny models run fastest with 1."""
    save_every: int = 0
    """Write a resumable checkpoint every N iterations/steps (0: only at the end and on SIGTERM)."""
    keep_checkpoints: int = 2
    """How many of the newest complete checkpoints to keep."""
    resume: bool = False
    """Continue from the newest complete checkpoint in output_dir when there is one."""
    progress: bool = True
    """Show a rich progress bar on the terminal."""
    tensorboard: bool = True
    """Also log to TensorBoard when it is installed."""
    max_consecutive_skips: int = 3
    """Stop (with a checkpoint of the last good state) after this many non-finite updates in a row."""
    concurrent_roles: bool = False
    """PPO: train the critic in a second thread while the policy trains (and run the reference
    pass beside the critic and reward passes). With threads=1 on a 2-core CPU this keeps both
    cores busy; results are identical to the sequential order."""

    def validate(self, prefix: str = "run") -> None:
        require(self.save_every >= 0, f"{prefix}.save_every", "must be >= 0")
        require(self.keep_checkpoints >= 1, f"{prefix}.keep_checkpoints", "must be >= 1")
        require(self.threads is None or self.threads >= 1, f"{prefix}.threads", "must be >= 1 or null")
        require(self.max_consecutive_skips >= 1, f"{prefix}.max_consecutive_skips", "must be >= 1")
        require(
            self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
            f"{prefix}.device",
            f"expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}",
        )


# ---------------------------------------------------------------------------------------------
# Gym stage: PPO / REINFORCE on a discrete-action Gymnasium environment (fourfold.trainers.gym).
# ---------------------------------------------------------------------------------------------


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
    """PPO with the usual implementation details (CleanRL's ppo.py names them the same way)."""

    total_timesteps: int = 100_000
    """Budget in environment steps (all envs together); the run always spends all of it unless
    stop_when_solved."""
    num_steps: int = 32
    """Steps per env per rollout: a batch is num_envs * num_steps transitions."""
    lr: float = 1e-3
    """Adam learning rate (Adam eps is adam_eps)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly from lr to 0 over the run."""
    gamma: float = 0.98
    """Discount factor."""
    gae_lambda: float = 0.8
    """GAE lambda (1 = Monte-Carlo returns minus V, 0 = one-step TD)."""
    num_minibatches: int = 1
    """Minibatches per epoch (shuffled each epoch); minibatch = batch / num_minibatches."""
    update_epochs: int = 20
    """Passes over each batch."""
    norm_adv: bool = True
    """Whiten advantages per minibatch (mean 0, std 1)."""
    clip_coef: float = 0.2
    """PPO ratio clip epsilon (also the value clip range when clip_vloss)."""
    clip_vloss: bool = False
    """Clip the value update around the rollout's values (PPO2-style clipped value loss)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
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
        require(0 <= self.gae_lambda <= 1, f"{prefix}.gae_lambda", "must be in [0, 1]")
        require(self.num_minibatches >= 1, f"{prefix}.num_minibatches", "must be >= 1")
        require(self.update_epochs >= 1, f"{prefix}.update_epochs", "must be >= 1")
        require(self.clip_coef > 0, f"{prefix}.clip_coef", "must be > 0")
        require(self.ent_coef >= 0, f"{prefix}.ent_coef", "must be >= 0")
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
        require(batch % self.ppo.num_minibatches == 0, "ppo.num_minibatches",
                f"must divide the batch env.num_envs * ppo.num_steps = {batch}")
        if self.algo == "ppo":
            require(self.ppo.total_timesteps >= batch, "ppo.total_timesteps",
                    f"must be at least one batch (env.num_envs * ppo.num_steps = {batch})")


# ---------------------------------------------------------------------------------------------
# Language-model stages: SFT, reward model, PPO, REINFORCE
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LMModelConfig:
    """Which models play which role. Paths are local HF directories (or hub names when online)."""

    policy: Optional[str] = None
    """The SFT model: initialises the policy and (unless `reference` is set) is the frozen reference."""
    reference: Optional[str] = None
    """Frozen reference for the KL penalty; null = a frozen copy of `policy`."""
    reward: Optional[str] = None
    """Reward-model directory (written by `fourfold reward`, or a 1-label sequence classifier)."""
    reward_fn: Optional[str] = None
    """Instead of a reward model: 'module:function' or 'path/to/file.py:function' with signature
    fn(prompts: list[str], responses: list[str]) -> list[float]."""
    critic: Optional[str] = None
    """Critic directory; null = initialise from `critic_init`."""
    critic_init: Literal["reward", "policy"] = "reward"
    """Initialise the critic's backbone from the reward model (default, its head too) or from the
    policy (fresh head, zero-initialised)."""
    tokenizer: Optional[str] = None
    """Tokenizer directory; null = the policy's."""
    trust_remote_code: bool = False
    """Allow model code from the model's repository. Off unless you trust the source."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype. float32 on CPU; bfloat16 on recent GPUs."""

    def validate(self, prefix: str = "model") -> None:
        require(self.policy is not None, f"{prefix}.policy", "missing: path to the SFT model directory")


@dataclasses.dataclass
class PromptDataConfig:
    """Where prompts come from."""

    prompts: Optional[str] = None
    """JSONL or Parquet file with a `prompt` (or chat `messages`) field per row."""
    task: Optional[str] = None
    """An embedded task name (e.g. 'review'), resolved by the CLI: prompts are sampled from it when
    `prompts` is null, and its hidden gold reward is logged as reward/gold_mean."""
    max_prompt_len: int = 64
    """Prompts longer than this many tokens are an error naming the file and line."""
    on_error: Literal["raise", "skip"] = "raise"
    """Bad rows: stop with an error naming file and line, or skip them and count them in the log."""

    def validate(self, prefix: str = "data") -> None:
        require(self.prompts is not None or self.task is not None, f"{prefix}.prompts",
                "missing: a prompts file (or data.task for an embedded task)")
        require(self.max_prompt_len >= 1, f"{prefix}.max_prompt_len", "must be >= 1")


@dataclasses.dataclass
class GenerationConfig:
    """How the policy samples responses during training."""

    max_new_tokens: int = 32
    """Longest response; rows stop at their first EOS."""
    temperature: float = 1.0
    """Sampling temperature; the same temperature scales every log-prob used in training."""
    missing_eos_score: Optional[float] = None
    """If set, a response that reaches max_new_tokens without EOS gets this score in place of the
    reward model's (counted as reward/no_eos_penalised)."""
    stop_at_eos: bool = True
    """Stop rows at EOS (false: fixed-length responses, used by benchmarks)."""

    def validate(self, prefix: str = "generation") -> None:
        require(self.max_new_tokens >= 1, f"{prefix}.max_new_tokens", "must be >= 1")
        require(self.temperature > 0, f"{prefix}.temperature", f"must be > 0, got {self.temperature}")


@dataclasses.dataclass
class PPOAlgoConfig:
    """PPO hyperparameters, named as in the literature (Ziegler et al. 2019, Ouyang et al. 2022)."""

    iterations: int = 100
    """PPO iterations; each samples rollout_batch_size prompts."""
    rollout_batch_size: int = 64
    """Prompts (= responses) per iteration."""
    minibatch_size: int = 16
    """Responses per optimizer step; rollout_batch_size / minibatch_size steps per epoch."""
    micro_batch_size: Optional[int] = None
    """Gradient-accumulation chunk within a minibatch (memory); null = the whole minibatch."""
    ppo_epochs: int = 4
    """Passes over each rollout batch."""
    clip_eps: float = 0.2
    """Clip range of the probability ratio in the surrogate objective."""
    vf_clip_eps: Optional[float] = 0.2
    """Clip range of the value update around the rollout's values; null = plain MSE."""
    gamma: float = 1.0
    """Discount (1: the episode is one response)."""
    lam: float = 0.95
    """GAE lambda."""
    kl_coef: float = 0.05
    """beta: weight of the per-token KL penalty to the reference."""
    kl_estimator: Literal["k1", "k2", "k3", "abs"] = "k1"
    """Per-token KL estimator used in the reward (k1 = log pi - log pi_ref)."""
    adaptive_kl: bool = False
    """Adapt kl_coef toward kl_target (Ziegler et al.)."""
    kl_target: float = 6.0
    """Target per-sequence KL (nats) of the adaptive controller."""
    kl_horizon: int = 10000
    """Horizon (in samples) of the adaptive controller."""
    lr: float = 1e-5
    """Policy learning rate (AdamW)."""
    critic_lr: float = 1e-5
    """Critic learning rate (AdamW)."""
    lr_schedule: Literal["linear", "constant"] = "linear"
    """Linear decay to 0 over all optimizer steps, or constant."""
    weight_decay: float = 0.0
    """AdamW weight decay for both trained models."""
    max_grad_norm: Optional[float] = 1.0
    """Global gradient-norm clip per model; null = no clipping."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus in the policy loss."""
    whiten_rewards: bool = False
    """Whiten the token rewards over the batch before GAE."""
    whiten_advantages: bool = True
    """Whiten advantages over the batch (valid tokens) before the epochs."""
    use_critic: bool = True
    """False: no value baseline; advantages are the whitened returns (ablation 'ppo-no-critic')."""

    def validate(self, prefix: str = "ppo") -> None:
        require(self.iterations >= 1, f"{prefix}.iterations", "must be >= 1")
        require(self.rollout_batch_size >= 1, f"{prefix}.rollout_batch_size", "must be >= 1")
        require(self.minibatch_size >= 1, f"{prefix}.minibatch_size", "must be >= 1")
        require(self.minibatch_size <= self.rollout_batch_size, f"{prefix}.minibatch_size",
                f"{self.minibatch_size} is larger than rollout_batch_size={self.rollout_batch_size}")
        require(self.rollout_batch_size % self.minibatch_size == 0, f"{prefix}.rollout_batch_size",
                f"{self.rollout_batch_size} is not divisible by minibatch_size={self.minibatch_size}")
        if self.micro_batch_size is not None:
            require(self.micro_batch_size >= 1 and self.minibatch_size % self.micro_batch_size == 0,
                    f"{prefix}.micro_batch_size", f"must divide minibatch_size={self.minibatch_size}")
        require(self.ppo_epochs >= 1, f"{prefix}.ppo_epochs", "must be >= 1")
        require(self.clip_eps > 0, f"{prefix}.clip_eps", f"must be > 0, got {self.clip_eps}")
        require(self.vf_clip_eps is None or self.vf_clip_eps > 0, f"{prefix}.vf_clip_eps", "must be > 0 or null")
        require(0 <= self.gamma <= 1, f"{prefix}.gamma", "must be in [0, 1]")
        require(0 <= self.lam <= 1, f"{prefix}.lam", "must be in [0, 1]")
        require(self.kl_coef >= 0, f"{prefix}.kl_coef", f"must be >= 0, got {self.kl_coef}")
        require(self.kl_target > 0, f"{prefix}.kl_target", "must be > 0")
        require(self.kl_horizon >= 1, f"{prefix}.kl_horizon", "must be >= 1")
        require(self.lr > 0, f"{prefix}.lr", "must be > 0")
        require(self.critic_lr > 0, f"{prefix}.critic_lr", "must be > 0")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, f"{prefix}.max_grad_norm", "must be > 0 or null")
        require(self.entropy_coef >= 0, f"{prefix}.entropy_coef", "must be >= 0")

    @property
    def steps_per_iteration(self) -> int:
        """Optimizer steps per iteration (per trained model)."""
        return self.ppo_epochs * (self.rollout_batch_size // self.minibatch_size)


@dataclasses.dataclass
class PPOConfig:
    """`fourfold ppo`: the four-model PPO stage."""

    model: LMModelConfig = dataclasses.field(default_factory=LMModelConfig)
    data: PromptDataConfig = dataclasses.field(default_factory=PromptDataConfig)
    generation: GenerationConfig = dataclasses.field(default_factory=GenerationConfig)
    ppo: PPOAlgoConfig = dataclasses.field(default_factory=PPOAlgoConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/ppo"))

    def validate(self, prefix: str = "") -> None:
        require((self.model.reward is None) != (self.model.reward_fn is None), "model.reward",
                "set exactly one of model.reward (a reward-model directory) and model.reward_fn")
        if self.model.reward is None and self.ppo.use_critic and self.model.critic is None:
            require(self.model.critic_init == "policy", "model.critic_init",
                    "'reward' needs model.reward; use critic_init=policy with a reward_fn")


@dataclasses.dataclass
class ReinforceAlgoConfig:
    """Naive REINFORCE: sequence reward, no critic, no clipping, one gradient step per batch."""

    iterations: int = 100
    """Iterations; each samples rollout_batch_size prompts and takes one optimizer step."""
    rollout_batch_size: int = 64
    """Prompts (= responses) per iteration = per gradient step."""
    lr: float = 1e-5
    """Learning rate (AdamW)."""
    kl_coef: float = 0.05
    """beta: the same per-token KL penalty as PPO, folded into the returns."""
    kl_estimator: Literal["k1", "k2", "k3", "abs"] = "k1"
    """Per-token KL estimator used in the reward."""
    baseline: Literal["none", "mean"] = "none"
    """'mean': subtract the batch-mean return (a variance-reduction option)."""
    max_grad_norm: Optional[float] = None
    """Global gradient-norm clip; null (default) = none, as naive REINFORCE has."""
    lr_schedule: Literal["linear", "constant"] = "constant"
    """LR schedule over the iterations."""

    def validate(self, prefix: str = "reinforce") -> None:
        require(self.iterations >= 1, f"{prefix}.iterations", "must be >= 1")
        require(self.rollout_batch_size >= 1, f"{prefix}.rollout_batch_size", "must be >= 1")
        require(self.lr > 0, f"{prefix}.lr", "must be > 0")
        require(self.kl_coef >= 0, f"{prefix}.kl_coef", f"must be >= 0, got {self.kl_coef}")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, f"{prefix}.max_grad_norm", "must be > 0 or null")


@dataclasses.dataclass
class ReinforceConfig:
    """`fourfold reinforce`: the naive policy-gradient baseline on the same rollout."""

    model: LMModelConfig = dataclasses.field(default_factory=LMModelConfig)
    data: PromptDataConfig = dataclasses.field(default_factory=PromptDataConfig)
    generation: GenerationConfig = dataclasses.field(default_factory=GenerationConfig)
    reinforce: ReinforceAlgoConfig = dataclasses.field(default_factory=ReinforceAlgoConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/reinforce"))

    def validate(self, prefix: str = "") -> None:
        require((self.model.reward is None) != (self.model.reward_fn is None), "model.reward",
                "set exactly one of model.reward (a reward-model directory) and model.reward_fn")


@dataclasses.dataclass
class InitModelConfig:
    """The model a stage starts from: a directory, or a fresh Llama-shaped model from a config."""

    path: Optional[str] = None
    """HF directory (or hub name when online) to start from."""
    tokenizer: Optional[str] = None
    """Tokenizer directory; null = `path`'s (required when training from scratch)."""
    from_scratch: bool = False
    """Build a random-init Llama from the sizes below instead of loading `path`."""
    hidden_size: int = 128
    """From scratch: hidden size."""
    num_layers: int = 2
    """From scratch: decoder layers."""
    num_heads: int = 4
    """From scratch: attention heads."""
    intermediate_size: Optional[int] = None
    """From scratch: MLP width (null = 4 x hidden)."""
    max_positions: int = 128
    """From scratch: longest sequence."""
    trust_remote_code: bool = False
    """Allow model code from the model's repository."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype."""

    def validate(self, prefix: str = "model") -> None:
        require(self.path is not None or self.from_scratch, f"{prefix}.path",
                "missing: a model directory (or model.from_scratch=true with model.tokenizer)")
        if self.from_scratch:
            require(self.tokenizer is not None or self.path is not None, f"{prefix}.tokenizer",
                    "training from scratch needs a tokenizer directory")
            require(self.hidden_size % self.num_heads == 0, f"{prefix}.hidden_size",
                    f"{self.hidden_size} is not divisible by num_heads={self.num_heads}")


@dataclasses.dataclass
class TrainLoopConfig:
    """Optimiser and loop of the supervised stages (SFT, reward model)."""

    epochs: float = 1.0
    """Passes over the training data (fractions allowed); ignored when max_steps is set."""
    max_steps: Optional[int] = None
    """Stop after this many optimizer steps."""
    batch_size: int = 16
    """Examples (pairs for the reward model) per optimizer step."""
    lr: float = 1e-4
    """Peak learning rate (AdamW)."""
    warmup_steps: int = 0
    """Linear warm-up steps, then linear decay to 0 (or constant, below)."""
    lr_schedule: Literal["linear", "constant"] = "linear"
    """Schedule after warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: Optional[float] = 1.0
    """Global gradient-norm clip; null = none."""
    max_len: int = 128
    """Longest prompt + response in tokens; longer examples are an error naming file and line."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at the end)."""
    log_every: int = 10
    """Write a metrics row every N steps."""

    def validate(self, prefix: str = "train") -> None:
        require(self.epochs > 0 or self.max_steps is not None, f"{prefix}.epochs", "must be > 0")
        require(self.max_steps is None or self.max_steps >= 1, f"{prefix}.max_steps", "must be >= 1 or null")
        require(self.batch_size >= 1, f"{prefix}.batch_size", "must be >= 1")
        require(self.lr > 0, f"{prefix}.lr", "must be > 0")
        require(self.warmup_steps >= 0, f"{prefix}.warmup_steps", "must be >= 0")
        require(self.max_len >= 2, f"{prefix}.max_len", "must be >= 2")
        require(self.log_every >= 1, f"{prefix}.log_every", "must be >= 1")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, f"{prefix}.max_grad_norm", "must be > 0 or null")


@dataclasses.dataclass
class SFTDataConfig:
    """SFT data: prompt/completion pairs, whole texts or chat messages."""

    train: Optional[str] = None
    """JSONL or Parquet with `prompt` + `completion` (or `response`), `text`, or `messages`."""
    eval: Optional[str] = None
    """Optional held-out file in the same format."""
    on_error: Literal["raise", "skip"] = "raise"
    """Bad rows: error naming file and line, or skip and count."""

    def validate(self, prefix: str = "data") -> None:
        require(self.train is not None, f"{prefix}.train", "missing: path to the training file")


@dataclasses.dataclass
class SFTConfig:
    """`fourfold sft`: next-token loss on the response part (prompt tokens masked)."""

    model: InitModelConfig = dataclasses.field(default_factory=InitModelConfig)
    data: SFTDataConfig = dataclasses.field(default_factory=SFTDataConfig)
    train: TrainLoopConfig = dataclasses.field(default_factory=TrainLoopConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/sft"))

    def validate(self, prefix: str = "") -> None:
        if self.model.from_scratch:
            require(self.train.max_len <= self.model.max_positions, "train.max_len",
                    f"{self.train.max_len} is more than model.max_positions={self.model.max_positions}")


@dataclasses.dataclass
class PreferenceDataConfig:
    """Preference pairs: `prompt`, `chosen`, `rejected` per row."""

    train: Optional[str] = None
    """JSONL or Parquet with prompt / chosen / rejected."""
    eval: Optional[str] = None
    """Held-out pairs; null = hold out `eval_fraction` of train."""
    eval_fraction: float = 0.1
    """Share of train held out when `eval` is null (0 = none)."""
    on_error: Literal["raise", "skip"] = "raise"
    """Bad rows: error naming file and line, or skip and count."""

    def validate(self, prefix: str = "data") -> None:
        require(self.train is not None, f"{prefix}.train", "missing: path to the preference file")
        require(0 <= self.eval_fraction < 1, f"{prefix}.eval_fraction", "must be in [0, 1)")


@dataclasses.dataclass
class RewardLossConfig:
    """Reward-model specifics."""

    margin: Optional[float] = None
    """Optional margin m in -log sigmoid(r_chosen - r_rejected - m)."""
    normalize: bool = True
    """After training, shift/scale the head so scores of the training responses (chosen and
    rejected, the reference samples) have mean 0 and std 1."""

    def validate(self, prefix: str = "reward") -> None:
        require(self.margin is None or self.margin >= 0, f"{prefix}.margin", "must be >= 0 or null")


@dataclasses.dataclass
class RewardConfig:
    """`fourfold reward`: a Bradley-Terry reward model from preference pairs."""

    model: InitModelConfig = dataclasses.field(default_factory=InitModelConfig)
    data: PreferenceDataConfig = dataclasses.field(default_factory=PreferenceDataConfig)
    train: TrainLoopConfig = dataclasses.field(default_factory=lambda: TrainLoopConfig(lr=5e-5))
    reward: RewardLossConfig = dataclasses.field(default_factory=RewardLossConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs/reward"))

    def validate(self, prefix: str = "") -> None:
        if self.model.from_scratch:
            require(self.train.max_len <= self.model.max_positions, "train.max_len",
                    f"{self.train.max_len} is more than model.max_positions={self.model.max_positions}")


# ---------------------------------------------------------------------------------------------
# The embedded default: `fourfold demo`
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class DemoModelConfig:
    """The tiny Llama-shaped model the demo trains from scratch (word-level tokenizer)."""

    hidden_size: int = 128
    """Hidden size of the SFT model (and so of every role: all are initialised from it)."""
    num_layers: int = 2
    """Decoder layers."""
    num_heads: int = 4
    """Attention heads."""
    max_positions: int = 64
    """Longest prompt + response in tokens."""

    def validate(self, prefix: str = "model") -> None:
        require(self.hidden_size % self.num_heads == 0, f"{prefix}.hidden_size", "must be divisible by num_heads")


@dataclasses.dataclass
class DemoSFTConfig:
    """Stage 1: the corpus and supervised fine-tuning from scratch."""

    examples: int = 20000
    """Generated reviews to train on."""
    steps: int = 1200
    """Optimizer steps."""
    batch_size: int = 32
    """Examples per step."""
    lr: float = 3e-3
    """Peak learning rate (warm-up then linear decay)."""


@dataclasses.dataclass
class DemoPairsConfig:
    """Stage 2: response pairs sampled from the SFT model, labelled by the simulated labelers."""

    pairs: int = 4000
    """Preference pairs for training the reward model."""
    eval_pairs: int = 500
    """Held-out pairs: reward-model accuracy against the labelers and against gold."""
    temperature: float = 1.0
    """Sampling temperature for the pairs."""
    slip_eval_pairs: int = 250
    """Held-out minimal pairs: an SFT sample against the same sample with one slip (a word
    substituted, swapped, dropped or repeated), labelled by the same labelers. The RM's accuracy
    on them says whether it sees grammar at all."""
    slip_pairs: int = 0
    """More such minimal pairs added to the RM's training data (0: none, the default). Natural
    pairs rarely differ in well-formedness, so without them the RM cannot learn that broken text
    is bad; they help only with a deeper RM (reward.extra_layers, see the README)."""

    def validate(self, prefix: str = "pairs") -> None:
        require(self.pairs > 0 and self.eval_pairs > 0, f"{prefix}.pairs", "pairs and eval_pairs must be > 0")
        require(self.slip_pairs >= 0, f"{prefix}.slip_pairs", f"must be >= 0, got {self.slip_pairs}")
        require(self.slip_eval_pairs >= 0, f"{prefix}.slip_eval_pairs", f"must be >= 0, got {self.slip_eval_pairs}")
        require(self.temperature > 0, f"{prefix}.temperature", f"must be > 0, got {self.temperature}")


@dataclasses.dataclass
class DemoRewardConfig:
    """Stage 3: the reward model, initialised from the SFT model."""

    steps: int = 600
    """Optimizer steps."""
    batch_size: int = 32
    """Pairs per step."""
    lr: float = 1e-3
    """Peak learning rate."""
    extra_layers: int = 0
    """Decoder layers added on top of the SFT model's before training (fourfold.models.factory.
    grow_layers: their output projections start at zero, so the grown model starts as the SFT
    model). With the SFT model's 2 layers alone the RM cannot learn to see a grammar slip, even
    from slip pairs; 0 (the default) keeps the RM the SFT model's size."""

    def validate(self, prefix: str = "reward") -> None:
        require(self.extra_layers >= 0, f"{prefix}.extra_layers", f"must be >= 0, got {self.extra_layers}")


@dataclasses.dataclass
class DemoEvalConfig:
    """Stage 5: before/after evaluation on held-out prompts."""

    prompts: int = 256
    """Held-out prompts (never seen in PPO)."""
    samples_in_report: int = 8
    """Rows of the before/after sample table (and of the per-token advantage view)."""


@dataclasses.dataclass
class DemoConfig:
    """`fourfold demo`: RLHF from zero on the embedded review task (SFT -> RM -> PPO -> eval -> report)."""

    quick: bool = False
    """A short budget (about 2 minutes on 2 cores) for tests and a first look."""
    fresh: bool = False
    """Ignore cached stage outputs and rerun every stage."""
    task_options: dict = dataclasses.field(default_factory=dict)
    """Options of the review task (fourfold.tasks.ReviewTaskConfig fields, e.g. labeler_length_bias)."""
    model: DemoModelConfig = dataclasses.field(default_factory=DemoModelConfig)
    sft: DemoSFTConfig = dataclasses.field(default_factory=DemoSFTConfig)
    pairs: DemoPairsConfig = dataclasses.field(default_factory=DemoPairsConfig)
    reward: DemoRewardConfig = dataclasses.field(default_factory=DemoRewardConfig)
    ppo: PPOAlgoConfig = dataclasses.field(default_factory=lambda: PPOAlgoConfig(
        iterations=150, rollout_batch_size=64, minibatch_size=16, lr=3e-4, critic_lr=1e-3, kl_coef=0.05))
    generation: GenerationConfig = dataclasses.field(default_factory=lambda: GenerationConfig(max_new_tokens=40))
    eval: DemoEvalConfig = dataclasses.field(default_factory=DemoEvalConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(
        output_dir="runs/demo", threads=1, save_every=10, concurrent_roles=True))


# ---------------------------------------------------------------------------------------------
# `fourfold experiments`: the method's claims as measured experiments (fourfold.experiments)
# ---------------------------------------------------------------------------------------------

EXPERIMENT_ARMS = ("ppo", "ppo-beta0", "ppo-beta-high", "ppo-1epoch", "ppo-no-critic", "reinforce",
                   "ppo-unbiased-rm", "ppo-adaptive-kl")
"""Arms `fourfold experiments` knows (see docs/experiments.md); 'reinforce' runs once per entry
of reinforce_lr_multipliers (as reinforce-lr1x, reinforce-lr3x, ...)."""

CLAIM_GROUPS = ("ppo", "beta0", "beta-high", "epochs", "reinforce", "critic", "length")
"""Groups of claims `fourfold experiments` checks; a group whose arms did not run is left out."""


@dataclasses.dataclass
class ExperimentsClaimsConfig:
    """Which claims are checked, and their thresholds. Gold and proxy differences are in units of
    the SFT model's per-sample standard deviation (sd) on the evaluation prompts; "in every seed"
    compares arms seed by seed (same seed = same prompt order)."""

    groups: list[str] = dataclasses.field(default_factory=lambda: list(CLAIM_GROUPS))
    """Claim groups to check: ppo, beta0, beta-high, epochs, reinforce, critic, length."""
    ppo_min_gold_gain_sd: float = 0.3
    """ppo: final gold above SFT's by at least this many sd, in every seed."""
    ppo_min_well_formed_ratio: float = 0.9
    """ppo: well-formed share at least this fraction of SFT's, in every seed."""
    beta0_min_gold_drop_sd: float = 0.5
    """ppo-beta0: final gold below both SFT's and ppo's by at least this many sd, in every seed."""
    beta0_min_kl_ratio: float = 5.0
    """ppo-beta0: KL to the reference at least this multiple of ppo's, in every seed."""
    beta0_min_degeneration: float = 0.1
    """ppo-beta0: well-formed share lower than ppo's, or repetition rate higher, by at least this
    (absolute share), in every seed."""
    beta0_proxy_margin_sd: float = 0.25
    """ppo-beta0: proxy (RM) reward at least ppo's minus this many (RM-score) sd, in every seed."""
    beta_high_max_kl: float = 0.2
    """ppo-beta-high: KL to the reference (nats per response) below this, in every seed."""
    noise_z: float = 2.0
    """'Within noise' / 'beyond noise': this many standard errors of the evaluation (finite
    sample of prompts and responses) of the difference."""
    clear_margin_sd: float = 0.5
    """'Clearly beats': gold higher by at least this many sd, in every seed."""

    def validate(self, prefix: str = "claims") -> None:
        for g in self.groups:
            close = difflib.get_close_matches(str(g), CLAIM_GROUPS, n=1, cutoff=0.5)
            require(g in CLAIM_GROUPS, f"{prefix}.groups", f"unknown group {g!r}"
                    + (f" (did you mean {close[0]!r}?)" if close else "") + f"; known: {', '.join(CLAIM_GROUPS)}")
        require(self.ppo_min_well_formed_ratio >= 0, f"{prefix}.ppo_min_well_formed_ratio", "must be >= 0")
        require(self.beta0_min_kl_ratio > 0, f"{prefix}.beta0_min_kl_ratio", "must be > 0")
        require(self.beta_high_max_kl > 0, f"{prefix}.beta_high_max_kl", "must be > 0")
        require(self.noise_z > 0, f"{prefix}.noise_z", "must be > 0")
        require(self.clear_margin_sd >= 0, f"{prefix}.clear_margin_sd", "must be >= 0")


@dataclasses.dataclass
class ExperimentsConfig:
    """`fourfold experiments`: every arm x seed on the demo's task at the same sample budget, a
    final evaluation of each saved policy on the same held-out prompts, report.html and summary.md
    with the claims table (see docs/experiments.md)."""

    quick: bool = False
    """A short check (about 5 minutes on 2 cores): seed 0, arms ppo / ppo-beta0 / ppo-beta-high, a
    short budget, the quick demo (demo.quick=true) and only the beta0 and beta-high claims. Default
    output paths get a '-quick' suffix so a quick run never replaces a full one."""
    fresh: bool = False
    """Rerun every arm and evaluation (the demo's cached stages are kept: use demo.fresh for those)."""
    demo: DemoConfig = dataclasses.field(default_factory=DemoConfig)
    """The shared SFT model and reward model: `fourfold demo`'s settings (its stages are reused from
    the cache in demo.run.output_dir), and its ppo/generation sections, the base of every arm."""
    arms: list[str] = dataclasses.field(default_factory=lambda: [
        "ppo", "ppo-beta0", "ppo-beta-high", "ppo-1epoch", "ppo-no-critic", "reinforce", "ppo-unbiased-rm"])
    """Arms to run: ppo, ppo-beta0, ppo-beta-high, ppo-1epoch, ppo-no-critic, reinforce,
    ppo-unbiased-rm, ppo-adaptive-kl (optional: demo.ppo.kl_target as the target)."""
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])
    """Seeds of every arm (run.seed of each run)."""
    iterations: int = 60
    """PPO iterations per run (each demo.ppo.rollout_batch_size samples); REINFORCE gets the same
    number of samples (same batch size, same number of iterations)."""
    workers: int = 2
    """Runs in parallel, each a `python -m fourfold.cli ppo|reinforce` subprocess with
    run.threads torch threads."""
    reinforce_lr_multipliers: list[float] = dataclasses.field(default_factory=lambda: [1.0, 3.0, 10.0])
    """REINFORCE learning rates as multiples of demo.ppo.lr (1.0 = PPO's; the best of the others is
    the tuned baseline)."""
    beta_high_multiplier: float = 100.0
    """ppo-beta-high uses kl_coef = this x demo.ppo.kl_coef."""
    unbiased_task_options: dict = dataclasses.field(default_factory=lambda: {"labeler_length_bias": 0.0})
    """Task options (over demo.task_options) of the labelers whose RM ppo-unbiased-rm uses."""
    unbiased_demo_dir: Optional[str] = None
    """Where the unbiased demo stages are cached; null = '<demo.run.output_dir>-unbiased'."""
    eval_prompts: int = 256
    """Held-out prompts of the final evaluation (the demo's eval prompts: the same for every run)."""
    samples_in_report: int = 4
    """Sample responses per arm shown in the report."""
    claims: ExperimentsClaimsConfig = dataclasses.field(default_factory=ExperimentsClaimsConfig)
    """Which claims are checked and their thresholds."""
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(
        output_dir="runs/experiments", threads=1, save_every=10, tensorboard=False))
    """output_dir: report.html, summary.md, runs/<arm>/seed<k>/, logs/; threads: torch threads of
    each run; save_every: checkpoint period of each run (an interrupted sweep resumes); device;
    progress. run.seed is not used (see seeds)."""

    def validate(self, prefix: str = "") -> None:
        for a in self.arms:
            close = difflib.get_close_matches(str(a), EXPERIMENT_ARMS, n=1, cutoff=0.5)
            require(a in EXPERIMENT_ARMS, "arms", f"unknown arm {a!r}"
                    + (f" (did you mean {close[0]!r}?)" if close else "") + f"; known: {', '.join(EXPERIMENT_ARMS)}")
        require(len(set(self.arms)) == len(self.arms), "arms", "an arm is listed twice")
        require(len(self.arms) >= 1, "arms", "must name at least one arm")
        require(len(self.seeds) >= 1, "seeds", "must list at least one seed")
        require(len(set(self.seeds)) == len(self.seeds), "seeds", "a seed is listed twice")
        require(self.iterations >= 1, "iterations", "must be >= 1")
        require(self.workers >= 1, "workers", "must be >= 1")
        if "reinforce" in self.arms:
            require(len(self.reinforce_lr_multipliers) >= 1, "reinforce_lr_multipliers", "must list at least one")
        require(all(m > 0 for m in self.reinforce_lr_multipliers), "reinforce_lr_multipliers", "must be > 0")
        require(len(set(self.reinforce_lr_multipliers)) == len(self.reinforce_lr_multipliers),
                "reinforce_lr_multipliers", "a multiplier is listed twice")
        require(self.beta_high_multiplier > 0, "beta_high_multiplier", "must be > 0")
        require(self.eval_prompts >= 2, "eval_prompts", "must be >= 2")
        require(self.samples_in_report >= 0, "samples_in_report", "must be >= 0")
        if "ppo-unbiased-rm" in self.arms:
            require(bool(self.unbiased_task_options), "unbiased_task_options",
                    "must change a task option (e.g. {labeler_length_bias: 0})")
