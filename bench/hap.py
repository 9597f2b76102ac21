"""The `hap` step's offline scorers: documents per second per core, and precision and recall on
the shipped labelled fixture (ylink/fixtures/hap_labelled.jsonl).

Speed is measured in this one process with one thread (OMP/BLAS limited to 1), on generated
English-like documents (ylink.runners.samples.synthetic_corpus: 4-7 lines of 2-4 sentences,
about 1.3 kB each), scoring as the step does (documents in batches of 256). Also measured:
better-profanity's own `contains_profanity` on the same documents (the library's matcher, which
the word-list scorer does not use), and whether the two agree on the fixture.

Precision and recall: a document is flagged when its score is above the step's default
threshold, 0.5 (for the word list: any listed word; for the classifier: its more likely class).

Target (issue 26): at least 5,000 documents/s per core for the word list.
"""

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ylink.runners.hap import ClassifierScorer, WordListScorer  # noqa: E402
from ylink.runners.samples import synthetic_corpus  # noqa: E402

FIXTURE = REPO / "ylink" / "fixtures" / "hap_labelled.jsonl"
THRESHOLD = 0.5
BATCH = 256


def docs_per_second(score, texts: list[str], min_seconds: float) -> float:
    done, started = 0, time.perf_counter()
    while True:
        for start in range(0, len(texts), BATCH):
            score(texts[start:start + BATCH])
        done += len(texts)
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return done / elapsed


def precision_recall(scores: list[float], labels: list[bool]) -> tuple[float, float, dict]:
    flagged = [score > THRESHOLD for score in scores]
    tp = sum(f and y for f, y in zip(flagged, labels, strict=True))
    fp = sum(f and not y for f, y in zip(flagged, labels, strict=True))
    fn = sum(y and not f for f, y in zip(flagged, labels, strict=True))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return precision, recall, {"tp": tp, "fp": fp, "fn": fn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=3.0, help="least time per measure")
    args = parser.parse_args()

    texts = [r["text"] for r in synthetic_corpus(args.documents, seed=0)]
    mean_chars = sum(map(len, texts)) / len(texts)
    records = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    fixture_texts = [r["text"] for r in records]
    labels = [bool(r["metadata"]["hap"]) for r in records]
    print(f"corpus: {len(texts)} generated documents, {mean_chars:.0f} characters each on "
          f"average; fixture: {len(records)} documents, {sum(labels)} labelled abusive")

    result: dict = {"documents": len(texts), "mean_chars": round(mean_chars),
                    "fixture_documents": len(records), "fixture_abusive": sum(labels),
                    "threshold": THRESHOLD}

    started = time.perf_counter()
    wordlist = WordListScorer()
    result["wordlist_load_s"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    classifier = ClassifierScorer()
    result["classifier_load_s"] = round(time.perf_counter() - started, 3)

    for name, scorer in (("wordlist", wordlist), ("classifier", classifier)):
        rate = docs_per_second(scorer.score_documents, texts, args.seconds)
        precision, recall, counts = precision_recall(scorer.score_documents(fixture_texts),
                                                     labels)
        print(f"{name:>10}: {rate:,.0f} documents/s on one core; on the fixture precision "
              f"{precision:.3f}, recall {recall:.3f} ({counts})")
        result[f"{name}_docs_s_core"] = round(rate)
        result[f"{name}_precision"] = round(precision, 3)
        result[f"{name}_recall"] = round(recall, 3)

    from better_profanity import profanity

    profanity.load_censor_words()
    subset = texts[: max(50, len(texts) // 20)]
    rate = docs_per_second(lambda batch: [profanity.contains_profanity(t) for t in batch],
                           subset, min(args.seconds, 2.0))
    library = [1.0 if profanity.contains_profanity(t) else 0.0 for t in fixture_texts]
    precision, recall, _ = precision_recall(library, labels)
    ours = wordlist.score_documents(fixture_texts)
    disagree = sum((a > THRESHOLD) != (b > THRESHOLD) for a, b in zip(ours, library,
                                                                        strict=True))
    print(f"better-profanity contains_profanity: {rate:,.0f} documents/s on one core; on the "
          f"fixture precision {precision:.3f}, recall {recall:.3f}; disagrees with the word-list "
          f"scorer on {disagree} of {len(records)} fixture documents")
    result["better_profanity_library_docs_s_core"] = round(rate)
    result["better_profanity_library_precision"] = round(precision, 3)
    result["better_profanity_library_recall"] = round(recall, 3)
    result["wordlist_vs_library_disagreements"] = disagree
    result["wordlist_target_docs_s_core"] = 5000
    result["wordlist_meets_target"] = result["wordlist_docs_s_core"] >= 5000
    print(json.dumps(result))


if __name__ == "__main__":
    main()
