#!/usr/bin/env python3
"""gguf-size.py FILE.gguf ORIG_FFN PADDED_FFN: a GGUF's file size and the size
it would have without the feed-forward padding (pad-llama2c-ffn.py): every
tensor whose shape has the padded width is counted at ORIG_FFN / PADDED_FFN of
its bytes. Prints: file_bytes corrected_bytes. Standard library only."""
import struct
import sys

# ggml type: (elements per block, bytes per block)
TYPES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
         9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
         14: (256, 210), 15: (256, 292), 30: (1, 2)}
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    path, orig, padded = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    b = open(path, "rb").read()
    if b[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    p = 4
    version, n_t, n_kv = struct.unpack_from("<IQQ", b, p)
    p += 20

    def string():
        nonlocal p
        n, = struct.unpack_from("<Q", b, p)
        p += 8 + n
        return b[p - n:p]

    def value(t):
        nonlocal p
        if t == 8:
            string()
        elif t == 9:
            et, n = struct.unpack_from("<IQ", b, p)
            p += 12
            for _ in range(n):
                value(et)
        else:
            p += SCALAR[t]

    for _ in range(n_kv):
        string()
        t, = struct.unpack_from("<I", b, p)
        p += 4
        value(t)
    total = corrected = 0.0
    for _ in range(n_t):
        string()
        nd, = struct.unpack_from("<I", b, p)
        p += 4
        dims = struct.unpack_from(f"<{nd}Q", b, p)
        p += 8 * nd
        t, = struct.unpack_from("<I", b, p)
        p += 12
        n = 1
        for d in dims:
            n *= d
        blk, size = TYPES[t]
        nbytes = n // blk * size
        total += nbytes
        corrected += nbytes * orig / padded if padded in dims else nbytes
    fsize = len(b)
    print(fsize, round(fsize - (total - corrected)))


main()
