#!/usr/bin/env python3
"""pad-llama2c-ffn.py IN.bin OUT.bin MULTIPLE: a llama2.c legacy float32
checkpoint with its feed-forward width padded to a multiple of MULTIPLE by
zero rows of w1 and w3 and zero columns of w2. silu(0) * 0 = 0 feeds zero
columns of w2, so the function is unchanged; llama.cpp's K-quants need rows
whose length is a multiple of 256. Standard library only."""
import array
import struct
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, mult = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(src, "rb") as f:
        hdr = f.read(28)
        data = array.array("f")
        data.frombytes(f.read())
    if sys.byteorder != "little":
        data.byteswap()
    dim, hidden, layers, heads, kv_heads, vocab, seq = struct.unpack("<7i", hdr)
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // heads
    kv = kv_heads * hd
    new = (hidden + mult - 1) // mult * mult
    pos = 0

    def take(n):
        nonlocal pos
        a = data[pos:pos + n]
        pos += n
        return a

    out = array.array("f")
    out.extend(take(vocab * dim))            # token embedding
    out.extend(take(layers * dim))           # rms_att
    out.extend(take(layers * dim * dim))     # wq
    out.extend(take(layers * kv * dim))      # wk
    out.extend(take(layers * kv * dim))      # wv
    out.extend(take(layers * dim * dim))     # wo
    out.extend(take(layers * dim))           # rms_ffn
    zrows = array.array("f", bytes(4 * (new - hidden) * dim))
    for _ in range(layers):                  # w1 [hidden][dim]
        out.extend(take(hidden * dim))
        out.extend(zrows)
    zcols = array.array("f", bytes(4 * (new - hidden)))
    for _ in range(layers):                  # w2 [dim][hidden]
        for _ in range(dim):
            out.extend(take(hidden))
            out.extend(zcols)
    for _ in range(layers):                  # w3 [hidden][dim]
        out.extend(take(hidden * dim))
        out.extend(zrows)
    out.extend(data[pos:])                   # rms_final, RoPE tables, classifier
    if sys.byteorder != "little":
        out.byteswap()
    with open(dst, "wb") as f:
        f.write(struct.pack("<7i", dim, new, layers, heads, kv_heads,
                            vocab if shared else -vocab, seq))
        out.tofile(f)
    print(f"{src}: hidden {hidden} -> {new} ({'shared' if shared else 'own'} classifier)")


main()
