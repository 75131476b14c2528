"""The report page: draws each plot into a PNG and collects them, with a note for each plot whose
data is missing, into one self-contained HTML page (images referenced by relative path).
A draw function returns a matplotlib Figure, or (Figure, note); it raises h5read.Missing when the
run lacks its data. Any other error is kept as a note too and counted in Page.errors, so one
broken plot never stops the page."""
import html
import os
import sys
import traceback

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from h5read import Missing  # noqa: E402


class Page:
    def __init__(self, out_dir, title):
        self.out_dir = out_dir
        self.title = title
        self.blocks = []  # ("h2", text) | ("plot", title, png or None, note) | ("html", raw)
        self.pngs = []  # the PNG paths written
        self.errors = 0
        os.makedirs(out_dir, exist_ok=True)

    def section(self, text):
        self.blocks.append(("h2", text))

    def raw(self, markup):
        self.blocks.append(("html", markup))

    def plot(self, name, title, draw, *args):
        """Runs draw(*args) and saves its figure as OUT_DIR/NAME.png."""
        note = ""
        try:
            out = draw(*args)
            fig, note = out if isinstance(out, tuple) else (out, "")
            png = name + ".png"
            fig.savefig(os.path.join(self.out_dir, png), dpi=100, bbox_inches="tight")
            plt.close(fig)
            self.pngs.append(os.path.join(self.out_dir, png))
        except Missing as e:
            png, note = None, f"skipped: {e}"
        except Exception as e:  # a bug or malformed data: keep going, say so
            self.errors += 1
            png, note = None, f"failed: {type(e).__name__}: {e}"
            print(f"{name}: {note}\n{traceback.format_exc()}", file=sys.stderr)
        plt.close("all")
        self.blocks.append(("plot", title, png, note))

    def write(self, path):
        title = html.escape(self.title)
        parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>",
                 "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
                 "img{max-width:100%}.note{color:#a40}table{border-collapse:collapse}"
                 "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}</style>",
                 f"</head><body><h1>{title}</h1>"]
        for b in self.blocks:
            if b[0] == "h2":
                parts.append(f"<h2>{html.escape(b[1])}</h2>")
            elif b[0] == "html":
                parts.append(b[1])
            else:
                _, title, png, note = b
                parts.append(f"<h3>{html.escape(title)}</h3>")
                if png:
                    parts.append(f"<img src='{html.escape(png)}' alt='{html.escape(title)}'>")
                if note:
                    parts.append(f"<p class='note'>{html.escape(note)}</p>")
        parts.append("</body></html>\n")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(parts))


def table(rows, header=None):
    """An HTML table of str-able cells."""
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in header) + "</tr>")
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>")
    out.append("</table>")
    return "".join(out)


def run_summary(run):
    """The run's /meta as a small table plus the resolved deck, folded."""
    rows = [(k, run.meta(k)) for k in ("deck_path", "started_utc", "build/git_sha", "build/backend",
                                       "build/compiler", "build/mpi") if run.meta(k)]
    rows.append(("files", ", ".join(sorted(n + ".h5" for n in run.files)) or "none"))
    model = run.meta("model")
    grid = run.meta("grid")
    deck = run.meta("deck_resolved")
    out = table(rows)
    if model:
        out += f"<p>{html.escape(model)}</p>"
    if grid:
        out += f"<pre>{html.escape(grid)}</pre>"
    if deck:
        out += f"<details><summary>resolved deck</summary><pre>{html.escape(deck)}</pre></details>"
    return out
