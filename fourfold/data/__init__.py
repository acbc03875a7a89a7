"""fourfold.data: reading user data files, validating them, tokenising and batching.

* :mod:`fourfold.data.io` - ``read_records``: JSONL / Parquet rows with their line numbers, and rows of
  a local ``datasets`` directory (``DIR`` or ``DIR:SPLIT``) or a hub dataset (``NAME:SPLIT``).
* :mod:`fourfold.data.formats` - typed records and validating loaders (field names documented there).
* :mod:`fourfold.data.collate` - tokenisation, padding and the resumable :class:`EpochSampler`.
* :mod:`fourfold.data.responses` - prompt + response rows (and preference pairs) tokenised and padded
  as PPO scores them.

Every problem with a user's file is a one-line :class:`fourfold.errors.DataError` naming the file,
the line and the problem; loaders and ``encode_*`` take ``on_error="skip"`` to skip and count bad rows.
"""

from fourfold.data.collate import (
    EpochSampler,
    PreferenceExample,
    PromptExample,
    SFTExample,
    collate_preferences,
    collate_sft,
    encode_preferences,
    encode_prompts,
    encode_sft,
    left_pad,
    right_pad,
    tokenize_preferences,
    tokenize_prompts,
    tokenize_sft,
)
from fourfold.data.formats import (
    PREFERENCE_FIELDS,
    PROMPT_FIELDS,
    RESPONSE_FIELDS,
    SFT_FIELDS,
    ChatRender,
    LoadResult,
    PreferenceRecord,
    PromptRecord,
    ResponseRecord,
    SFTRecord,
    TemplateText,
    chat_template_renderer,
    load_preferences,
    load_prompts,
    load_responses,
    load_sft,
    plain_chat_render,
    split_common_prefix,
)
from fourfold.data.io import line_of, location, read_records, read_source
from fourfold.data.responses import ResponseExample, collate_pair_responses, collate_responses, encode_responses

__all__ = [
    "read_records",
    "read_source",
    "location",
    "line_of",
    "PromptRecord",
    "SFTRecord",
    "PreferenceRecord",
    "ResponseRecord",
    "LoadResult",
    "ChatRender",
    "TemplateText",
    "load_prompts",
    "load_sft",
    "load_preferences",
    "load_responses",
    "plain_chat_render",
    "chat_template_renderer",
    "split_common_prefix",
    "PROMPT_FIELDS",
    "SFT_FIELDS",
    "PREFERENCE_FIELDS",
    "RESPONSE_FIELDS",
    "PromptExample",
    "SFTExample",
    "PreferenceExample",
    "encode_prompts",
    "tokenize_prompts",
    "left_pad",
    "right_pad",
    "encode_sft",
    "collate_sft",
    "tokenize_sft",
    "encode_preferences",
    "collate_preferences",
    "tokenize_preferences",
    "EpochSampler",
    "ResponseExample",
    "encode_responses",
    "collate_responses",
    "collate_pair_responses",
]
