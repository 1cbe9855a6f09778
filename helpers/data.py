"""The course corpus: the Python standard library's own source code, split by file.

Every machine that runs Python has this text offline: real code with English docstrings and
comments. Files are chosen deterministically (sorted paths); generated tables and data dumps are left
out. Validation: the library modules (not tests) whose path hashes to 0 mod 20, about 1 in 20.
Training: every other file, the standard library's own test suite included (it triples the data). A fingerprint
(file list, sizes and sha256) is recorded with every checkpoint, so you can tell whether your
Python's standard library is the one the shipped models were trained on.

The validation text of the shipped models is also stored in the repo (``data/validation.txt.gz``)
so that every notebook measures the same bytes on any Python version.

Out of scope: streaming huge corpora; anything but the standard library.

    python -m helpers.data            # build the token cache and print the corpus fingerprint
"""

from __future__ import annotations

import gzip
import hashlib
import json
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .paths import CACHE, DATA, REPO

VALIDATION_FILE = DATA / "validation.txt.gz"

# Left out: vendored packages, and files that are data rather than code (character-map tables in
# encodings/, the pydoc topic dump, the build configuration dump).
EXCLUDED_PARTS = {"site-packages", "encodings", "pydoc_data", "__phello__"}
TEST_PARTS = {"test", "tests", "idle_test"}  # test suites: training only
EXCLUDED_PREFIXES = ("config-", "_sysconfigdata")
FILE_SEPARATOR = "<|eos|>"  # documents are joined with end-of-text tokens


@dataclass(frozen=True)
class CorpusFile:
    path: str  # relative to the stdlib root, with forward slashes
    size: int
    sha256: str

    @property
    def is_test(self) -> bool:
        return bool(TEST_PARTS.intersection(self.path.split("/")))

    @property
    def is_validation(self) -> bool:
        # a stable hash of the path, so the split never depends on the file list's order
        return not self.is_test and int(hashlib.sha256(self.path.encode()).hexdigest(), 16) % 20 == 0


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def list_corpus_files(root: Path | None = None) -> list[CorpusFile]:
    root = root or stdlib_root()
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if EXCLUDED_PARTS.intersection(rel.parts) or rel.parts[0].startswith(EXCLUDED_PREFIXES):
            continue
        data = p.read_bytes()
        files.append(CorpusFile(rel.as_posix(), len(data), hashlib.sha256(data).hexdigest()))
    return files


def corpus_fingerprint(files: list[CorpusFile]) -> dict:
    """A short summary that changes if any file, its content, or the split changes."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.path}\t{f.sha256}\t{int(f.is_validation)}\n".encode())
    n_val = sum(f.is_validation for f in files)
    return {
        "source": "python stdlib",
        "python": platform.python_version(),
        "files": len(files),
        "train_files": len(files) - n_val,
        "validation_files": n_val,
        "train_bytes": sum(f.size for f in files if not f.is_validation),
        "validation_bytes": sum(f.size for f in files if f.is_validation),
        "sha256": h.hexdigest(),
    }


def read_split(split: str, root: Path | None = None) -> list[str]:
    """The text of every file in `split` ('train' or 'validation'), in path order."""
    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation'; got {split!r}")
    root = root or stdlib_root()
    want_val = split == "validation"
    return [
        (root / f.path).read_text(encoding="utf-8", errors="surrogateescape")
        for f in list_corpus_files(root)
        if f.is_validation == want_val
    ]


def validation_text() -> str:
    """The shipped models' validation text (the held-out files joined by end-of-text markers)."""
    if not VALIDATION_FILE.exists():
        raise FileNotFoundError(
            f"{VALIDATION_FILE} is missing; rebuild it with `python -m helpers.data --write-validation`"
        )
    return gzip.decompress(VALIDATION_FILE.read_bytes()).decode("utf-8", errors="surrogateescape")


def validation_documents() -> list[str]:
    return validation_text().split(FILE_SEPARATOR)


def encode_documents(tokenizer, docs: list[str]) -> np.ndarray:
    """Concatenate documents as  <bos> doc <eos> <bos> doc <eos> ...  into one uint16 array."""
    ids: list[int] = []
    for d in docs:
        ids.extend(tokenizer.encode(d, bos=True, eos=True))
    return np.asarray(ids, dtype=np.uint16)


def token_cache(tokenizer, split: str, tokenizer_sha256: str) -> tuple[np.ndarray, int]:
    """Token ids and byte count of a split, cached on disk (keyed by corpus and tokenizer)."""
    files = list_corpus_files()
    key = f"{corpus_fingerprint(files)['sha256'][:16]}-{tokenizer_sha256[:16]}-{split}"
    path = CACHE / f"tokens-{key}.npy"
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        return np.load(path), json.loads(meta.read_text())["bytes"]
    docs = read_split(split)
    ids = encode_documents(tokenizer, docs)
    n_bytes = sum(len(d.encode("utf-8", errors="surrogateescape")) for d in docs)
    CACHE.mkdir(exist_ok=True)
    np.save(path, ids)
    meta.write_text(json.dumps({"bytes": n_bytes, "tokens": int(len(ids))}))
    return ids, n_bytes


def main():
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-validation", action="store_true", help=f"(re)write {VALIDATION_FILE.relative_to(REPO)}")
    args = ap.parse_args()
    files = list_corpus_files()
    print(json.dumps(corpus_fingerprint(files), indent=2))
    if args.write_validation:
        text = FILE_SEPARATOR.join(read_split("validation"))
        VALIDATION_FILE.parent.mkdir(exist_ok=True)
        # mtime=0 keeps the file byte-identical across rebuilds
        VALIDATION_FILE.write_bytes(gzip.compress(text.encode("utf-8", errors="surrogateescape"), 9, mtime=0))
        print(f"wrote {VALIDATION_FILE} ({VALIDATION_FILE.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
