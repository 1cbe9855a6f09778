"""Learn the course tokenizer's merges from the training split and write helpers/checkpoints/tokenizer.json.

    python -m helpers.train_tokenizer            # vocabulary of 2048: 256 bytes + 1790 merges + 2 special tokens

Deterministic: the same corpus gives the same file. Retraining the tokenizer invalidates the shipped
model checkpoints (their token ids would mean different text), so retrain those afterwards.
"""

import argparse

from . import data
from .checkpoint import TOKENIZER_FILE
from .tokenizer import train_bpe


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vocab-size", type=int, default=2048)
    args = ap.parse_args(argv)
    text = "\n".join(data.read_split("train"))
    tok = train_bpe(text, args.vocab_size, verbose=True)
    tok.save(TOKENIZER_FILE)
    print(f"wrote {TOKENIZER_FILE}: {tok}")


if __name__ == "__main__":
    main()
