"""The tree's own convert_hf_to_gguf.py on a tiny Qwen4Exp model (make_model.py, gguf_pack.py).

The converter's vocabulary: the tree's Qwen3.5 vocab (151,936 tokens) padded to the model's
248,320, since a test model ships no tokenizer."""

from __future__ import annotations

import os
import sys


def convert(src: str, hf: str, outfile: str, outtype: str, vocab_size: int, eos: int) -> None:
    """Converts the transformers checkpoint `hf` to `outfile` (--outtype `outtype`)."""
    for p in (os.path.join(src, "gguf-py"), src):
        if p not in sys.path:
            sys.path.insert(0, p)
    import convert_hf_to_gguf
    import gguf
    from conversion.qwen4exp import Qwen4ExpTextModel

    vocab = gguf.GGUFReader(os.path.join(src, "models", "ggml-vocab-qwen35.gguf"))

    def field(name):
        return vocab.fields[name].contents()

    def set_vocab(self):
        tokens, types = list(field("tokenizer.ggml.tokens")), list(field("tokenizer.ggml.token_type"))
        for i in range(len(tokens), vocab_size):
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        w = self.gguf_writer
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(field("tokenizer.ggml.pre"))
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(list(field("tokenizer.ggml.merges")))
        w.add_eos_token_id(eos)
        w.add_pad_token_id(eos)

    Qwen4ExpTextModel.set_vocab = set_vocab
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", hf, "--outtype", outtype, "--outfile", outfile]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv
