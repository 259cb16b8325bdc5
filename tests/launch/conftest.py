"""Fixtures the launch tests share."""
import json

import pytest


@pytest.fixture
def config_folder(tmp_path):
    """A model folder holding only a small config.json (2 layers, hidden 64, vocab 1000): enough for
    the memory plan, which reads the shapes and never loads a model."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1000, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 256}))
    return folder
