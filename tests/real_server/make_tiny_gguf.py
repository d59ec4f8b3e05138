#!/usr/bin/env python3
"""Write a tiny random-weight Llama-architecture GGUF model that llama.cpp (llama-cpp-python) loads.

Usage: python3 make_tiny_gguf.py OUT.gguf

It exists so end-to-end tests can run a real third-party OpenAI-compatible server
(`python3 -m llama_cpp.server`) on CPU without downloading any model. The weights are random
(fixed seed, so the file is byte-identical on every run), the answers are gibberish.

Model: llama architecture, 2 layers, hidden 64, 4 heads (head dim 16), FFN 128, context 512,
f32 weights (0.5 MB file).

Tokenizer: GPT-2 style byte-level BPE ("gpt2" / pre "gpt-2"): the 256 byte tokens (ids
0..255, in GPT-2's byte-to-unicode spelling), a fixed list of merges of common English
letter pairs, then the specials <|endoftext|> (bos/pad), <|im_start|>, <|im_end|> (eos).
Any UTF-8 text tokenizes (every byte has a token).

Output shaping: embedding dimension 0 carries a large constant, and the output matrix gives
every token that is not printable ASCII (bytes >= 0x80, control bytes, the special tokens,
including eos) a large negative weight on that dimension. So generated text is always
printable ASCII and generation never stops on eos: a request gets exactly `max_tokens`
tokens (finish_reason "length"), or runs to the end of the context when max_tokens is absent.
A request can still force eos with `logit_bias` (the id is printed by this script; see
README.md) or end early with `stop`.

Chat template: ChatML, byte-identical to llama-cpp-python's CHATML_CHAT_TEMPLATE, so the
server picks its built-in "chatml" chat format (stop on <|im_end|>).
"""

import sys

import numpy as np
import gguf

SEED = 1234
N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 4
N_FF = 128
N_CTX = 512
HEAD_DIM = N_EMBD // N_HEAD

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Common English letter pairs / short pieces; each becomes a merge "A B" -> token "AB".
# Order = merge rank. Pieces are written in plain text and mapped to GPT-2's byte alphabet
# (space -> 'Ġ').
MERGE_PIECES = [
    ("t", "h"), (" ", "t"), (" ", "a"), ("h", "e"), ("i", "n"), ("e", "r"), ("o", "n"),
    ("r", "e"), ("a", "n"), ("e", "n"), ("a", "t"), ("o", "r"), ("e", "s"), ("i", "s"),
    (" ", "s"), (" ", "w"), (" ", "c"), (" ", "o"), (" ", "b"), (" ", "f"), (" ", "p"),
    (" ", "m"), (" ", "i"), (" ", "d"), ("i", "t"), ("n", "d"), ("o", "u"), ("e", "d"),
    ("a", "r"), ("a", "l"), ("s", "t"), ("l", "e"), ("i", "c"), ("n", "g"), ("r", "o"),
    ("l", "l"), ("a", "s"), ("v", "e"), ("c", "h"), ("s", "e"), ("u", "r"), ("e", "f"),
    (" t", "he"), (" a", "nd"), ("in", "g"), (" t", "o"), (" o", "f"), (" i", "n"),
    (" i", "s"), ("i", "on"), ("en", "t"), ("t", "ion"), (" f", "or"), ("d", "ef"),
    (" ", "="), (" ", "+"), ("(", ")"), (":", "\n"), ("\n", "\n"), (" ", " "),
]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character mapping."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build_vocab():
    b2u = bytes_to_unicode()
    enc = lambda s: "".join(b2u[b] for b in s.encode("utf-8"))  # noqa: E731

    tokens: list[str] = [b2u[b] for b in range(256)]
    types: list[int] = [int(gguf.TokenType.NORMAL)] * 256
    printable: list[bool] = [0x20 <= b <= 0x7E for b in range(256)]
    index = {t: i for i, t in enumerate(tokens)}
    merges: list[str] = []
    for a, b in MERGE_PIECES:
        ea, eb = enc(a), enc(b)
        assert ea in index and eb in index, (a, b)
        merged = ea + eb
        assert merged not in index, (a, b)
        merges.append(f"{ea} {eb}")
        index[merged] = len(tokens)
        tokens.append(merged)
        types.append(int(gguf.TokenType.NORMAL))
        printable.append(all(0x20 <= c <= 0x7E for c in (a + b).encode()))

    specials = {}
    for name in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        specials[name] = len(tokens)
        tokens.append(name)
        types.append(int(gguf.TokenType.CONTROL))
        printable.append(False)
    return tokens, types, merges, printable, specials


def main() -> None:
    if len(sys.argv) != 2:
        print(__doc__.splitlines()[2], file=sys.stderr)
        sys.exit(2)
    out = sys.argv[1]

    tokens, types, merges, printable, specials = build_vocab()
    n_vocab = len(tokens)
    rng = np.random.RandomState(SEED)

    w = gguf.GGUFWriter(out, "llama")
    w.add_name("switchyard-tiny-random")
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(specials["<|endoftext|>"])
    w.add_eos_token_id(specials["<|im_end|>"])
    w.add_pad_token_id(specials["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    def rand(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    # numpy shape is (rows, cols) = ggml ne reversed: a weight mapping in->out is (out, in).
    embd = rand(n_vocab, N_EMBD, scale=0.5)
    embd[:, 0] = 4.0  # the constant "bias" dimension (see module doc)
    w.add_tensor("token_embd.weight", embd)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rand(N_EMBD, N_EMBD, scale=0.1))
        w.add_tensor(p + "attn_k.weight", rand(N_HEAD_KV * HEAD_DIM, N_EMBD, scale=0.1))
        w.add_tensor(p + "attn_v.weight", rand(N_HEAD_KV * HEAD_DIM, N_EMBD, scale=0.1))
        # Outputs into the residual stream leave dimension 0 alone.
        o = rand(N_EMBD, N_EMBD, scale=0.05)
        o[0, :] = 0.0
        w.add_tensor(p + "attn_output.weight", o)
        w.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(N_FF, N_EMBD, scale=0.1))
        w.add_tensor(p + "ffn_up.weight", rand(N_FF, N_EMBD, scale=0.1))
        d = rand(N_EMBD, N_FF, scale=0.05)
        d[0, :] = 0.0
        w.add_tensor(p + "ffn_down.weight", d)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    head = rand(n_vocab, N_EMBD, scale=0.5)
    head[:, 0] = np.where(np.array(printable), 0.0, -20.0).astype(np.float32)
    w.add_tensor("output.weight", head)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(
        f"wrote {out}: vocab {n_vocab} (eos <|im_end|> = {specials['<|im_end|>']}, "
        f"bos <|endoftext|> = {specials['<|endoftext|>']}), ctx {N_CTX}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
