"""tarxz.py - writes a reproducible .tar.xz of in-memory text files (UTF-8, mtime 0, mode 0644,
xz preset 9), the form of the committed tokenizer fixtures; shared by gen_corpus.py and
gen_feature_cases.py."""
import io
import tarfile


def write_tar_xz(out, files):
    """Writes the (name in the archive, text) pairs to `out`; returns the archive's size."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tf:
        for name, data in files:
            b = data.encode("utf-8")
            ti = tarfile.TarInfo(name)
            ti.size = len(b)
            ti.mtime = 0
            ti.mode = 0o644
            tf.addfile(ti, io.BytesIO(b))
    with open(out, "wb") as f:
        f.write(buf.getvalue())
    return len(buf.getvalue())
