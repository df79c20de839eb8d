"""Python-source corpus for the pycoder-moe model: discovery, license filter, dedup, split.

Owns: which files of the running interpreter's image become training / held-out text.
Sources: the standard library of the interpreter that runs this script (PSF license) and every
installed distribution in its site-packages whose metadata declares a permissive license
(classifiers, License-Expression or License field; see PERMISSIVE_* below).
Invariants:
  * a file is used once: exact duplicates (same bytes, SHA-256) are dropped, keeping the first
    by sorted relative path;
  * the split is by file: files are visited in order of SHA-256 of their relative path
    ("stdlib/..." or "<dist>/<path in site-packages>"); the first kept ones, up to >= heldout_bytes
    of text, are held out, the next ones (up to max_train_bytes) are train.  Deterministic for a
    given image;
  * only UTF-8 text between MIN_BYTES and MAX_BYTES with no very long lines is kept.
"""
import hashlib
import importlib.metadata as md
import json
import os
import re
import sysconfig

MIN_BYTES = 200
MAX_BYTES = 400_000
MAX_LINE = 400          # files with a longer line are generated tables / minified data

# SPDX ids / classifier fragments treated as permissive.
PERMISSIVE_SPDX = {
    "MIT", "MIT-0", "BSD-2-CLAUSE", "BSD-3-CLAUSE", "BSD-3-CLAUSE-CLEAR", "BSD", "0BSD",
    "APACHE-2.0", "APACHE", "PSF-2.0", "PSF", "PYTHON-2.0", "ISC", "ZLIB", "UNLICENSE",
    "HPND", "CNRI-PYTHON", "BSL-1.0", "CC0-1.0", "X11", "NCSA", "UPL-1.0",
}
PERMISSIVE_CLASSIFIERS = (
    "MIT License", "BSD License", "Apache Software License", "Python Software Foundation License",
    "ISC License", "zlib/libpng License", "The Unlicense", "Historical Permission Notice",
    "Boost Software License", "CC0", "MIT No Attribution License", "Universal Permissive License",
)
NONPERMISSIVE_WORDS = ("GPL", "GENERAL PUBLIC", "MPL", "MOZILLA", "EPL", "ECLIPSE", "CDDL",
                       "EUPL", "PROPRIETARY", "COMMERCIAL", "CC-BY-NC", "SSPL", "BUSL")


def _norm_license_id(s):
    return s.strip().strip("()").upper()


def classify_license(meta):
    """Return (permissive: bool, label: str) from a distribution's metadata."""
    classifiers = [c for c in (meta.get_all("Classifier") or []) if c.startswith("License ::")]
    expr = (meta.get("License-Expression") or "").strip()
    text = (meta.get("License") or "").strip()
    labels = []
    if expr:
        ids = [_norm_license_id(t) for t in re.split(r"\s+(?:AND|OR|WITH)\s+|[()]", expr) if t.strip()]
        ok = all(i in PERMISSIVE_SPDX or i.startswith("LLVM-EXCEPTION") for i in ids)
        return ok, expr
    lic_cls = [c for c in classifiers if c != "License :: OSI Approved"]
    if lic_cls:
        for c in lic_cls:
            labels.append(c.split("::")[-1].strip())
            if not any(p in c for p in PERMISSIVE_CLASSIFIERS):
                return False, "; ".join(labels)
        return True, "; ".join(labels)
    if text:
        head = text[:400].upper()
        if any(w in head for w in NONPERMISSIVE_WORDS):
            return False, text.splitlines()[0][:80]
        for key, label in (("MIT", "MIT"), ("PERMISSION IS HEREBY GRANTED", "MIT"),
                           ("BSD", "BSD"), ("REDISTRIBUTION AND USE IN SOURCE", "BSD"),
                           ("APACHE", "Apache-2.0"), ("PSF", "PSF"), ("PYTHON SOFTWARE", "PSF"),
                           ("ISC", "ISC")):
            if key in head:
                return True, label
        return False, text.splitlines()[0][:80]
    return False, "unknown"


def _read_ok(path):
    try:
        st = os.stat(path)
        if st.st_size < MIN_BYTES or st.st_size > MAX_BYTES:
            return None
        with open(path, "rb") as f:
            data = f.read()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "\x00" in text:
        return None
    if max((len(l) for l in text.split("\n")), default=0) > MAX_LINE:
        return None
    return text


def discover(stdlib=None, site_dirs=None, log=print):
    """Yield (relpath, abspath, source_label, license_label) for candidate files."""
    paths = sysconfig.get_paths()
    stdlib = stdlib or paths["stdlib"]
    site_dirs = site_dirs or sorted({paths["purelib"], paths["platlib"]})
    site_real = {os.path.realpath(s) for s in site_dirs}
    out = []
    # 1) standard library
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__")
                         and os.path.realpath(os.path.join(root, d)) not in site_real)
        for fn in sorted(files):
            if fn.endswith(".py"):
                ap = os.path.join(root, fn)
                out.append(("stdlib/" + os.path.relpath(ap, stdlib), ap, "python-stdlib", "PSF-2.0"))
    log(f"corpus: stdlib {stdlib}: {len(out)} .py files")
    # 2) installed distributions with permissive licenses
    packages = {}
    n0 = len(out)
    for sd in site_dirs:
        for dist in md.distributions(path=[sd]):
            name = dist.metadata.get("Name") or "unknown"
            ok, label = classify_license(dist.metadata)
            files = [f for f in (dist.files or []) if str(f).endswith(".py")]
            key = name.lower()
            if key in packages:
                continue
            packages[key] = {"name": name, "version": dist.version, "license": label,
                             "permissive": ok, "py_files": len(files)}
            if not ok:
                continue
            for f in files:
                ap = os.path.normpath(os.path.join(sd, str(f)))
                if not ap.startswith(os.path.normpath(sd) + os.sep):
                    continue   # scripts installed outside site-packages
                out.append((f"{name}/{os.path.relpath(ap, sd)}", ap, name, label))
    log(f"corpus: site-packages {site_dirs}: {len(packages)} distributions, "
        f"{sum(p['permissive'] for p in packages.values())} permissive, {len(out) - n0} .py files")
    return out, {"stdlib": stdlib, "site_dirs": site_dirs, "packages": packages}


def _path_key(rel):
    return hashlib.sha256(rel.encode("utf-8")).hexdigest()


def build(heldout_bytes=6_000_000, max_train_bytes=None, stdlib=None, site_dirs=None,
          max_files=None, log=print):
    """Read, filter, dedup and split.  Returns dict with train/heldout lists of (relpath, text).

    Files are visited in order of SHA-256(relative path).  A file is dropped if unreadable / not
    UTF-8 / outside the size and line-length limits, or if its exact content (SHA-256) was already
    kept.  The first kept files, until their total reaches heldout_bytes, form the held-out set;
    the following ones form the train set, until max_train_bytes (if given) is reached; reading
    stops there, so huge images cost no more than the budget."""
    from concurrent.futures import ThreadPoolExecutor
    cands, info = discover(stdlib, site_dirs, log)
    cands.sort(key=lambda c: _path_key(c[0]))
    if max_files:    # toy runs: a deterministic subset
        cands = cands[:max_files]
    seen = set()
    heldout, train = [], []
    ho_bytes = tr_bytes = 0
    n_dup = n_bad = n_seen = 0
    used_by_source = {}
    done = False
    chunk = 2048
    with ThreadPoolExecutor(max_workers=min(32, (os.cpu_count() or 2) * 2)) as ex:
        for c0 in range(0, len(cands), chunk):
            part = cands[c0:c0 + chunk]
            texts = list(ex.map(lambda c: _read_ok(c[1]), part))
            for (rel, ap, src, lic), text in zip(part, texts):
                n_seen += 1
                if text is None:
                    n_bad += 1
                    continue
                data = text.encode("utf-8")
                h = hashlib.sha256(data).digest()
                if h in seen:
                    n_dup += 1
                    continue
                seen.add(h)
                if ho_bytes < heldout_bytes:
                    heldout.append((rel, text))
                    ho_bytes += len(data)
                else:
                    train.append((rel, text))
                    tr_bytes += len(data)
                u = used_by_source.setdefault(src, {"files": 0, "bytes": 0, "license": lic})
                u["files"] += 1
                u["bytes"] += len(data)
                if max_train_bytes is not None and tr_bytes >= max_train_bytes:
                    done = True
                    break
            if done:
                break
    train.sort(key=lambda k: k[0])
    stats = {
        "candidates": len(cands), "examined": n_seen, "rejected": n_bad, "duplicates": n_dup,
        "heldout_files": len(heldout), "heldout_bytes": ho_bytes,
        "train_files": len(train), "train_bytes": tr_bytes,
        "stopped_at_train_budget": done,
        "by_source": dict(sorted(used_by_source.items())),
    }
    log(f"corpus: {len(cands)} candidates, {n_seen} examined, {n_bad} rejected (size/encoding/long "
        f"lines), {n_dup} exact duplicates; heldout {len(heldout)} files {ho_bytes / 1e6:.2f} MB; "
        f"train {len(train)} files {tr_bytes / 1e6:.1f} MB")
    return {"train": train, "heldout": heldout, "stats": stats, "info": info}


if __name__ == "__main__":
    import sys, time
    t = time.time()
    r = build(max_train_bytes=float(sys.argv[1]) * 1e6 if len(sys.argv) > 1 else None)
    print(json.dumps(r["stats"], indent=1)[:3000])
    print("time", time.time() - t)
