"""`hwbench data prepare`: text to a Megatron .bin/.idx dataset (hwbench.workload.prepare)."""

from __future__ import annotations

import argparse

DESCRIPTION = ("Tokenize text into a Megatron dataset PREFIX_KEY_document.bin/.idx (as Megatron's "
               "tools/preprocess_data.py).")


def configure(parser: argparse.ArgumentParser) -> None:
    from hwbench.cli import Parser
    from hwbench.workload.prepare import (
        INPUT_FORMATS,
        TEXT_DOCUMENTS,
        TOKENIZER_ALIASES,
        TOKENIZERS,
    )

    actions = parser.add_subparsers(dest="data_command", required=True, metavar="prepare", parser_class=Parser)
    prepare = actions.add_parser("prepare", help=DESCRIPTION, description=DESCRIPTION)
    prepare.add_argument("--input", required=True, metavar="PATH",
                         help="JSON lines (.json/.jsonl) or plain text (.txt), optionally .gz/.xz/.bz2")
    prepare.add_argument("--input-format", choices=INPUT_FORMATS, help="json or text (default: from the file name)")
    prepare.add_argument("--json-keys", nargs="+", metavar="KEY",
                         help="keys of each JSON line to tokenize, one output each (default: text)")
    prepare.add_argument("--text-document", choices=TEXT_DOCUMENTS,
                         help="plain text: a document is a blank-line-separated paragraph, a line or the whole "
                              "file (default: paragraph)")
    prepare.add_argument("--tokenizer", "--tokenizer-type", type=lambda text: TOKENIZER_ALIASES.get(text, text),
                         choices=TOKENIZERS,
                         help="gpt2-bpe (needs --vocab-file, --merge-file; Megatron's GPT2BPETokenizer), huggingface "
                              "(needs --tokenizer-model; Megatron's HuggingFaceTokenizer) or byte (UTF-8 bytes, no "
                              "files) (default: huggingface with --tokenizer-model, else gpt2-bpe)")
    prepare.add_argument("--vocab-file", metavar="PATH", help="GPT-2 gpt2-vocab.json")
    prepare.add_argument("--merge-file", metavar="PATH", help="GPT-2 gpt2-merges.txt")
    prepare.add_argument("--tokenizer-model", metavar="PATH",
                         help="a Hugging Face tokenizer.json, or the folder holding it (Llama 3's, say); its "
                              "special tokens are added as transformers adds them (Llama 3: <|begin_of_text|> "
                              "first); nothing is downloaded")
    prepare.add_argument("--eod-token", metavar="TOKEN",
                         help="the token --append-eod adds with --tokenizer-model (default: the eos_token of a "
                              "tokenizer_config.json beside it, as transformers reads it)")
    prepare.add_argument("--append-eod", action="store_true", help="end every document with the end-of-text id")
    prepare.add_argument("--workers", type=int, default=1, metavar="N",
                         help="worker processes, one core each: 1 to twice the usable cores (default: 1)")
    prepare.add_argument("--output-prefix", required=True, metavar="PREFIX",
                         help="writes PREFIX_KEY_document.bin and .idx")
    prepare.add_argument("--quiet", action="store_true", help="no progress line")


def main(args: argparse.Namespace) -> int:
    """Prepares and prints the summary; UsageError and KeyboardInterrupt go to the CLI
    (one line, exit 2 or 130)."""
    from hwbench.workload.prepare import prepare, summary_table

    summary = prepare(
        args.input, args.output_prefix, tokenizer=args.tokenizer, vocab_file=args.vocab_file,
        merge_file=args.merge_file, tokenizer_model=args.tokenizer_model, eod_token=args.eod_token,
        json_keys=args.json_keys, input_format=args.input_format,
        text_document=args.text_document, append_eod=args.append_eod, workers=args.workers,
        progress=not args.quiet,
    )
    print(summary_table(summary))
    return 0
