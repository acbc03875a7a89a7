"""Multi-turn SFT (data.assistant_turns: all): every assistant message of a `messages` row is
trained, each tokenised on its own with EOS after it, the text between them not trained; the
default (last) is unchanged. Hand-computed ids and label mask."""

import json

import pytest

from fourfold.config import SFTConfig
from fourfold.data import collate_sft, encode_sft, load_sft
from fourfold.data.chat import chat_template_renderer
from fourfold.data.observations import ObservationEncoder
from fourfold.errors import DataError
from fourfold.tasks.tokenizer import build_word_tokenizer

WORDS = [f"w{i}" for i in range(10)] + ["user", "tool", "assistant", "q1", "t1"]
TEMPLATE = ("{% for m in messages %}<bos>{{ m['role'] }} {{ m['content'] }}<eos> {% endfor %}"
            "{% if add_generation_prompt %}<bos>assistant {% endif %}")
ROW = {"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "w1 w2"},
                    {"role": "tool", "content": "t1"}, {"role": "assistant", "content": "w3"}]}


@pytest.fixture
def tok():
    t = build_word_tokenizer(WORDS)
    t.chat_template = TEMPLATE
    return t


def _file(tmp_path, rows):
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_assistant_turn_is_trained(tmp_path, tok):
    ids = {w: tok.convert_tokens_to_ids(w) for w in WORDS}
    bos, eos = tok.bos_token_id, tok.eos_token_id
    records = load_sft(_file(tmp_path, [ROW]), chat_template=chat_template_renderer(tok), assistant_turns="all")
    (ex,) = encode_sft(records, tok, 64)
    prompt = [bos, ids["user"], ids["q1"], eos, bos, ids["assistant"]]
    between = [bos, ids["tool"], ids["t1"], eos, bos, ids["assistant"]]
    assert ex.input_ids == prompt + [ids["w1"], ids["w2"], eos] + between + [ids["w3"], eos]
    assert ex.loss_mask == (0,) * 6 + (1, 1, 1) + (0,) * 6 + (1, 1)
    assert ex.num_prompt_tokens == 6
    # the text between two turns is what a multi-turn rollout appends after the policy's EOS
    assert ObservationEncoder(tok).next([{"role": "tool", "content": "t1"}], "x") == between
    batch = collate_sft([ex, *encode_sft(load_sft(_file(tmp_path, [ROW]), chat_template=chat_template_renderer(tok)),
                                         tok, 64)], tok.pad_token_id)
    assert batch["loss_mask"][0].tolist() == list(ex.loss_mask)
    # the default trains the last assistant message only; the earlier ones are prompt
    last = batch["loss_mask"][1].tolist()
    n = int(batch["attention_mask"][1].sum())
    assert last[:n] == [0] * (n - 2) + [1, 1] and last[n:] == [0] * (len(last) - n)


def test_the_plain_rendering_without_a_template(tmp_path):
    (rec,) = load_sft(_file(tmp_path, [ROW]), assistant_turns="all")
    assert rec.prompt == "user: q1\nassistant: "
    assert rec.turns == (("w1 w2", True), ("\ntool: t1\nassistant: ", False), ("w3", True))
    (one,) = load_sft(_file(tmp_path, [{"messages": ROW["messages"][:2]}]), assistant_turns="all")
    assert one.turns == () and one.completion == "w1 w2"  # a single assistant message: as before


def test_turns_are_cut_at_max_len_or_refused(tmp_path, tok):
    records = load_sft(_file(tmp_path, [ROW]), chat_template=chat_template_renderer(tok), assistant_turns="all")
    (ex,) = encode_sft(records, tok, 10)
    assert ex.truncated and len(ex.input_ids) == 10 and ex.loss_mask == (0,) * 6 + (1, 1, 1, 0)
    with pytest.raises(DataError, match="sft.jsonl:1: prompt \\+ assistant turns have 17 tokens, more than max_len=10"):
        encode_sft(records, tok, 10, truncate=False)
    bad = {"messages": ROW["messages"][:1] + [{"role": "assistant", "content": " "}] + ROW["messages"][2:]}
    with pytest.raises(DataError, match="sft.jsonl:1: assistant message 0 \\(message 1\\) is empty"):
        load_sft(_file(tmp_path, [bad]), assistant_turns="all")


def test_the_config_key(tmp_path):
    from fourfold.config import ConfigError, SFTDataConfig, config_from_dict

    cfg = config_from_dict(SFTDataConfig, {"train": "t.jsonl", "assistant_turns": "all"})
    assert cfg.assistant_turns == "all" and SFTConfig().data.assistant_turns == "last"
    with pytest.raises(ConfigError, match="assistant_turns: expected one of 'last', 'all'"):
        config_from_dict(SFTDataConfig, {"train": "t.jsonl", "assistant_turns": "first"})
    with pytest.raises(ValueError, match="assistant_turns must be one of last, all"):
        load_sft(_file(tmp_path, [ROW]), assistant_turns="first")


def test_the_sft_stage_reads_the_key(tmp_path, tok):
    from fourfold.trainers.sft import encode_file

    path = str(_file(tmp_path, [ROW]))
    (all_turns,), _, _ = encode_file(path, tok, 64, "raise", "all")
    (last,), _, _ = encode_file(path, tok, 64, "raise")
    assert sum(all_turns.loss_mask) == 5 and last.loss_mask is None
