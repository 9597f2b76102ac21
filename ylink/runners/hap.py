"""Hate, abuse and profanity (HAP) scores of documents, for the `hap` step.

The contract of IBM data-prep-kit's HAP transform: a document is split into sentences, each
sentence is scored in [0, 1], and the document's score is the highest of its sentences' scores.
Sentences end at '.', '!' or '?' followed by white space, and at line breaks: a plain rule that
costs little next to scoring.

Scorers (each `score_documents(texts) -> list[float]`):
- `wordlist`: better-profanity's shipped word list (the package's data file; its own matcher is
  too slow for a corpus, so the list is matched here as a token set plus one compiled regex for
  the entries with spaces, hyphens or dots, leetspeak digits and symbols mapped back to letters).
  A sentence scores 1.0 when it holds a listed word, else 0.0.
- `classifier`: alt-profanity-check's shipped TF-IDF + linear SVM (calibrated); a sentence
  scores the probability of its "offensive" class. Works offline: the model is in the wheel.
- `model`: a sequence classifier from a local folder (the model registry's copy, e.g. IBM
  granite-guardian-hap-38m); a sentence scores the softmax probability of the HAP label.

No Django and no datatrove here: the bench and the runner's step both use it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources

from ylink.steps import HAP_SCORERS

__all__ = [
    "SCORERS",
    "ClassifierScorer",
    "ModelScorer",
    "WordListScorer",
    "hap_label_index",
    "make_scorer",
    "model_references",
    "split_sentences",
]

SCORERS = HAP_SCORERS

_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n")


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`: cut after . ! ? followed by white space, and at each line break;
    blank pieces are left out."""
    return [piece for piece in (p.strip() for p in _SENTENCE_BREAK.split(text)) if piece]


def _max_per_document(counts: list[int], scores: Sequence[float]) -> list[float]:
    result, start = [], 0
    for count in counts:
        result.append(float(max(scores[start:start + count])) if count else 0.0)
        start += count
    return result


# -- word list --------------------------------------------------------------------------------
_TOKEN = re.compile(r"[\w@$]+")
# Leetspeak as better-profanity reads it (its CHARS_MAPPING, one way: digit or symbol -> letter;
# '*' is left out: it stands for any vowel there, and masked words are out of scope).
_LEET = str.maketrans({"@": "a", "4": "a", "$": "s", "5": "s", "0": "o", "1": "i", "3": "e",
                       "7": "t"})


class WordListScorer:
    """1.0 for a document with a listed word in any sentence, else 0.0 (see the module doc).

    A listed entry never spans a sentence break (no entry holds a line break or . ! ? followed
    by white space, and the words of an entry match across spaces, tabs and hyphens only), so
    the highest sentence score equals matching the whole document at once, which is what this
    does: no splitting needed."""

    def __init__(self, words: Sequence[str] | None = None):
        if words is None:
            source = resources.files("better_profanity") / "profanity_wordlist.txt"
            words = source.read_text(encoding="utf-8").splitlines()
        entries = {word.strip().lower() for word in words if word.strip()}
        self.words = frozenset(entry for entry in entries if _TOKEN.fullmatch(entry))
        phrases = sorted(entries - self.words, key=len, reverse=True)
        self.phrases = re.compile(
            r"(?<![\w@$])(?:"
            + "|".join(r"[ \t-]+".join(map(re.escape, re.split(r"[\s-]+", p))) for p in phrases)
            + r")(?![\w@$])"
        ) if phrases else None
        # The phrase regex is the slow part: run it only when every token of some phrase is in
        # the text (a phrase's tokens are whole tokens of any text it matches).
        self.phrase_tokens: dict[str, list[frozenset[str]]] = {}
        for phrase in phrases:
            pieces = frozenset(_TOKEN.findall(phrase))
            if not pieces:
                self.phrase_tokens.setdefault("", []).append(pieces)
                continue
            anchor = max(sorted(pieces), key=len)
            self.phrase_tokens.setdefault(anchor, []).append(pieces)

    def score_text(self, text: str) -> float:
        lowered = text.lower()
        tokens = set(_TOKEN.findall(lowered))
        if not tokens.isdisjoint(self.words):
            return 1.0
        leet = {token.translate(_LEET) for token in tokens if not token.isalpha()}
        if leet and not leet.isdisjoint(self.words):
            return 1.0
        if self.phrases is not None and self._may_hold_a_phrase(tokens) and \
                self.phrases.search(lowered):
            return 1.0
        return 0.0

    def _may_hold_a_phrase(self, tokens: set[str]) -> bool:
        if "" in self.phrase_tokens:
            return True
        for anchor in tokens.intersection(self.phrase_tokens):
            if any(pieces <= tokens for pieces in self.phrase_tokens[anchor]):
                return True
        return False

    def score_documents(self, texts: Sequence[str]) -> list[float]:
        return [self.score_text(text) for text in texts]

    def score_sentences(self, sentences: Sequence[str]) -> list[float]:
        return self.score_documents(sentences)


# -- classifier -------------------------------------------------------------------------------
class ClassifierScorer:
    """alt-profanity-check's model, all sentences of a batch of documents in one call."""

    def __init__(self):
        # Importing the package loads its vectorizer and model from the wheel (~1.5 s).
        from profanity_check import profanity_check

        self.vectorizer = profanity_check.vectorizer
        self.model = profanity_check.model

    def score_sentences(self, sentences: Sequence[str]) -> list[float]:
        if not sentences:
            return []
        return self.model.predict_proba(self.vectorizer.transform(sentences))[:, 1].tolist()

    def score_documents(self, texts: Sequence[str]) -> list[float]:
        per_doc = [split_sentences(text) for text in texts]
        flat = [sentence for sentences in per_doc for sentence in sentences]
        return _max_per_document([len(s) for s in per_doc], self.score_sentences(flat))


# -- a transformer from the registry ----------------------------------------------------------
_HAP_LABEL = re.compile(r"hap|hate|abus|toxic|offens|profan|insult|obscen", re.IGNORECASE)


def hap_label_index(id2label: dict) -> int:
    """The class index of "hate/abusive/profane" in a classifier's config.id2label: a label
    naming it, or index 1 of a two-class model with generic labels (granite-guardian-hap-38m:
    LABEL_0 = clean, LABEL_1 = HAP)."""
    labels = {int(index): str(label) for index, label in id2label.items()}
    named = [index for index, label in labels.items() if _HAP_LABEL.search(label)]
    if len(named) == 1:
        return named[0]
    if len(labels) == 2 and all(re.fullmatch(r"LABEL_\d+", label) for label in labels.values()):
        return 1
    raise ValueError(f"cannot tell which label is hate/abuse/profanity among {labels}; "
                     "expected a label naming it or two classes LABEL_0 (clean), LABEL_1 (HAP)")


class ModelScorer:
    """A transformers sequence classifier from a local folder, scoring sentences in batches."""

    def __init__(self, path: str, *, batch_size: int = 32, max_length: int = 512,
                 device: str | None = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            path, local_files_only=True)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device).eval()
        self.label = hap_label_index(self.model.config.id2label)
        self.batch_size = batch_size
        limit = getattr(self.tokenizer, "model_max_length", max_length) or max_length
        self.max_length = min(max_length, limit)

    def score_sentences(self, sentences: Sequence[str]) -> list[float]:
        scores: list[float] = [0.0] * len(sentences)
        # Similar lengths batched together pad less.
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
        with self.torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                encoded = self.tokenizer([sentences[i] for i in chunk], padding=True,
                                         truncation=True, max_length=self.max_length,
                                         return_tensors="pt").to(self.device)
                logits = self.model(**encoded).logits.float()
                probabilities = logits.softmax(dim=-1)[:, self.label].tolist()
                for i, value in zip(chunk, probabilities, strict=True):
                    scores[i] = value
        return scores

    def score_documents(self, texts: Sequence[str]) -> list[float]:
        per_doc = [split_sentences(text) for text in texts]
        flat = [sentence for sentences in per_doc for sentence in sentences]
        return _max_per_document([len(s) for s in per_doc], self.score_sentences(flat))


def make_scorer(scorer: str, model_path: str | None = None):
    if scorer == "wordlist":
        return WordListScorer()
    if scorer == "classifier":
        return ClassifierScorer()
    if scorer == "model":
        if not model_path:
            raise ValueError("the model scorer needs the model's local folder")
        return ModelScorer(model_path)
    raise ValueError(f"unknown HAP scorer {scorer!r}; known: {', '.join(SCORERS)}")


def model_references(steps: list[dict]) -> list[tuple[int, str]]:
    """(step index, registry reference) of each `hap` step that scores with a model."""
    return [(index, step["params"]["model"]) for index, step in enumerate(steps)
            if step["type"] == "hap" and step["params"]["scorer"] == "model"]
