"""fourfold.data: reading user data files, validating them, tokenising and batching.

* :mod:`fourfold.data.io` - ``read_records``: JSONL / Parquet rows with their line numbers.
* :mod:`fourfold.data.formats` - typed records and validating loaders (field names documented there).
* :mod:`fourfold.data.collate` - tokenisation, padding and the resumable :class:`EpochSampler`.

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
    SFT_FIELDS,
    ChatRender,
    LoadResult,
    PreferenceRecord,
    PromptRecord,
    SFTRecord,
    TemplateText,
    chat_template_renderer,
    load_preferences,
    load_prompts,
    load_sft,
    plain_chat_render,
)
from fourfold.data.io import line_of, read_records

__all__ = [
    "read_records",
    "line_of",
    "PromptRecord",
    "SFTRecord",
    "PreferenceRecord",
    "LoadResult",
    "ChatRender",
    "TemplateText",
    "load_prompts",
    "load_sft",
    "load_preferences",
    "plain_chat_render",
    "chat_template_renderer",
    "PROMPT_FIELDS",
    "SFT_FIELDS",
    "PREFERENCE_FIELDS",
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
]
