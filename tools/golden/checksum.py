"""checksum.py - the file checksum the golden tests compare (zlib CRC-32, as
tests/unit/golden_util.h computes it): shared by make_golden.py and make_pycoder_golden.py."""
import zlib


def crc32(path):
    c = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return c & 0xFFFFFFFF
            c = zlib.crc32(b, c)
