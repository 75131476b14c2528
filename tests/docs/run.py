#!/usr/bin/python3
"""The docs test tier: the documentation is checked against the built binary.

1. Every fenced shell block in README.md and docs/ that follows a `<!-- doc-test -->` line runs
   (bash -e, from the repository root) and must exit 0.
2. Every ```yaml block that is a deck (has a top-level `job:` key) passes `hymoe DECK --check` at
   its own layout. A block whose first line is `# jobs/NAME/deck.yaml` (or another path) must
   equal that file; other blocks are checked from jobs/NAME/ for the NAME a `# in jobs/NAME/`
   first line gives, else from jobs/quickstart/.
3. docs/reference/deck.md equals `hymoe --describe-deck` (make docs writes it), and every
   relative link and #anchor in the docs resolves.
4. Every dataset docs/reference/outputs.md names exists in the files a quick run of each job
   kind writes, and every dataset those files hold is named there.
Ends with "N passed, N failed, N skipped"; exit 1 when any failed.
Environment: HYMOE_BIN (default build/hymoe), DOC_TEST_ONLY=commands|decks|reference|links|outputs.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.chdir(ROOT)
BIN = os.environ.get("HYMOE_BIN", "build/hymoe")
ONLY = os.environ.get("DOC_TEST_ONLY", "")
results = {"passed": 0, "failed": 0, "skipped": 0}


def report(ok, what, detail=""):
    results["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + what)
    if not ok and detail:
        print("     " + detail.strip().replace("\n", "\n     ")[-3000:])


def run(cmd, timeout=300, **kw):
    p = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True,
                       timeout=timeout, executable="/bin/bash" if isinstance(cmd, str) else None,
                       **kw)
    return p.returncode, p.stdout + p.stderr


def doc_files():
    return ["README.md"] + sorted(glob.glob("docs/**/*.md", recursive=True))


def fences(path):
    """(line, language, text, marked) for every fenced block of a Markdown file."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        marked = i > 0 and lines[i - 1].strip() == "<!-- doc-test -->"
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        out.append((i + 1, m.group(1), "\n".join(lines[i + 1:j]) + "\n", marked))
        i = j + 1
    return out


def check_commands():
    env = dict(os.environ, PATH=os.path.join(ROOT, "build") + ":" + os.environ["PATH"])
    for path in doc_files():
        for line, lang, text, marked in fences(path):
            if not marked:
                continue
            if lang not in ("sh", "bash"):
                report(False, f"{path}:{line}: a doc-test block must be ```sh, not ```{lang}")
                continue
            code, out = run("set -eo pipefail\n" + text, env=env)
            report(code == 0, f"{path}:{line}: runs ({text.splitlines()[0][:60]})",
                   f"exit {code}\n{out}")


def deck_ranks(deck):
    code, out = run([BIN, deck, "--ranks"])
    return int(out.strip().splitlines()[-1]) if code == 0 else 1


def check_decks():
    for path in doc_files():
        for line, lang, text, _ in fences(path):
            if lang != "yaml" or not re.search(r"^job:", text, re.M):
                continue
            first = text.splitlines()[0]
            m = re.match(r"#\s*(\S+\.yaml)\s*$", first)
            where = f"{path}:{line}"
            if m and os.path.exists(m.group(1)):
                body = text.split("\n", 1)[1]  # the block without its "# path" line
                same = open(m.group(1)).read().strip() == body.strip()
                report(same, f"{where}: equals {m.group(1)}",
                       "the block differs from the file; copy the file into the doc")
                deck, tmp = m.group(1), None
            else:
                m = re.match(r"#\s*in\s+(\S+)/?\s*$", first)
                folder = m.group(1) if m else "jobs/quickstart"
                fd, tmp = tempfile.mkstemp(suffix=".yaml", prefix=".doc-deck-", dir=folder)
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                deck = tmp
            try:
                n = deck_ranks(deck)
                cmd = [BIN, deck, "--check"] if n == 1 else \
                    ["mpirun", "-np", str(n), BIN, deck, "--check"]
                code, out = run(cmd)
                report(code == 0, f"{where}: deck passes --check ({n} rank(s))", out)
            finally:
                if tmp:
                    os.remove(tmp)


def check_reference():
    code, out = run([BIN, "--describe-deck"])
    have = open("docs/reference/deck.md", encoding="utf-8").read()
    report(code == 0 and out == have, "docs/reference/deck.md equals hymoe --describe-deck",
           "run `make docs` and commit docs/reference/deck.md")


def anchors(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out = set()
    for h in re.findall(r"^#+ (.*)$", text, re.M):
        a = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        out.add(a)
    return out


def check_links():
    bad = []
    for path in doc_files():
        text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+://", target):
                continue
            file, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                if not dest.startswith("docs/guide/precision"):  # pages other branches add
                    bad.append(f"{path}: {target} (no such file)")
            elif frag and dest.endswith(".md") and frag not in anchors(dest):
                bad.append(f"{path}: {target} (no such heading)")
    report(not bad, f"links: every relative link and anchor resolves", "\n".join(bad))


# ---- outputs ------------------------------------------------------------------------------------

def expand(name):
    m = re.match(r"^(.*)\{([^}]*)\}(.*)$", name)
    if not m:
        return [name]
    items = [re.sub(r"\(.*?\)", "", x).strip() for x in m.group(2).split(",")]
    return [n for x in items for n in expand(m.group(1) + x + m.group(3))]


def documented():
    """{file key: set of dataset paths} from outputs.md; key "meta" applies to every file."""
    docs, key = {}, None
    for row in open("docs/reference/outputs.md", encoding="utf-8"):
        h = re.match(r"^#{2,4} (.*)", row)
        if h:
            t = h.group(1)
            key = ("meta" if "HDF5 schema" in t else
                   "results-lora" if "results.h5` (lora" in t else
                   "results-infer" if "results.h5` (infer" in t else
                   "profile" if "profile.h5" in t else
                   "plan" if "plan.h5" in t else None)
            continue
        if key is None or not row.startswith("| `/"):
            continue
        cell = row.split("|")[1]
        k = "plan" if "(`plan.h5`)" in cell else key
        for name in re.findall(r"`(/[^`]*)`", cell):
            for n in expand(name):
                docs.setdefault(k, set()).add(n)
    return docs


def datasets(path):
    import h5py
    names = set()
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: names.add("/" + n) if isinstance(o, h5py.Dataset) else None)
    return names


def covered(name, pool):
    return name in pool or any(p.endswith("/*") and name.startswith(p[:-1]) for p in pool)


def check_outputs():
    docs = documented()
    tmp = tempfile.mkdtemp(prefix="hymoe-doc-outputs-")
    runs = {
        "results-infer": ("jobs/quickstart/deck.yaml",
                          ["--set", "inference.max_new_tokens=4", "--set",
                           "inference.prompt_logprobs=true", "--set", "inference.logprobs=2"],
                          "results.h5"),
        "results-infer-text": ("tests/decks/text/deck.yaml", [], "results.h5"),
        "profile": ("jobs/images/deck.yaml", ["--set", "inference.max_new_tokens=2"],
                    "profile.h5"),
        "results-lora": ("jobs/lora-quickstart/deck.yaml",
                         ["--set", "finetune.steps=2", "--set", "finetune.eval.every=1",
                          "--set", "finetune.checkpoint.every=0"], "results.h5"),
        "plan": ("jobs/plan-flagship/deck.yaml", [], "plan.h5"),
    }
    have = {}
    try:
        for key, (deck, sets, name) in runs.items():
            out = os.path.join(tmp, key)
            code, log = run([BIN, deck, "--set", f"job.output={out}"] + sets)
            ok = code == 0 and os.path.exists(os.path.join(out, name))
            report(ok, f"outputs: {deck} writes {name}", log)
            if ok:
                have.setdefault(key.replace("-text", ""), set()).update(
                    datasets(os.path.join(out, name)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    meta = docs.get("meta", set())
    for key, names in sorted(have.items()):
        pool = docs.get(key, set()) | meta
        undocumented = sorted(n for n in names if not covered(n, pool))
        report(not undocumented, f"outputs: every dataset of {key} is in outputs.md",
               "not documented: " + ", ".join(undocumented))
        missing = sorted(n for n in docs.get(key, set()) if "*" not in n and "<" not in n and
                         n not in names)
        report(not missing, f"outputs: every {key} dataset outputs.md names is written",
               "named but not written: " + ", ".join(missing))
    meta_missing = sorted(n for n in meta if "<" not in n and not n.startswith("/grid") and
                          not all(n in v for v in have.values()))
    report(not meta_missing, "outputs: every /meta dataset is in every file",
           "missing: " + ", ".join(meta_missing))


checks = {"commands": check_commands, "decks": check_decks, "reference": check_reference,
          "links": check_links, "outputs": check_outputs}
for name, fn in checks.items():
    if ONLY and ONLY != name:
        continue
    try:
        fn()
    except Exception as e:  # a crashed check is a failure, not a silent pass
        report(False, f"{name}: {type(e).__name__}: {e}")
print(f"{results['passed']} passed, {results['failed']} failed, {results['skipped']} skipped")
sys.exit(1 if results["failed"] else 0)
