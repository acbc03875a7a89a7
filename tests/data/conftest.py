"""Fixtures for tests/data."""
import pytest
from datatest_utils import make_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def tokenizer_no_bos():
    return make_tokenizer(bos=False)
