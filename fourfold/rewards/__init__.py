"""fourfold.rewards: the usual verifiable checks, as reward functions a config can name.

Each is an ordinary reward function (``fn(prompts, responses, **columns) -> list[float]``, see
:mod:`fourfold.models.reward_fn`), so ``model.reward_fn: fourfold.rewards:answer_match`` works as
any user's function does; the ones with settings are built by a factory (``format_match(r"...")``).

- :func:`final_answer` / :func:`normalize_answer`: what a response answers, and the form two answers
  are compared in (``" 1,000. "`` and ``"1000"`` are the same answer);
- :func:`answer_match`: 1 where a response's final answer equals the row's ``answer`` column;
- :func:`format_match`: 1 where a response matches a regular expression;
- :func:`length_penalty`: minus ``coef`` per word past ``max_words``.

Pure Python (``re`` and the standard library): nothing here imports torch.
"""

from fourfold.rewards.checks import answer_match, final_answer, format_match, length_penalty, normalize_answer

__all__ = ["answer_match", "final_answer", "format_match", "length_penalty", "normalize_answer"]
