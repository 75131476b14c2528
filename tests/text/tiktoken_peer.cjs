// The peer side of the tokenizer tests and benchmark: OpenAI's tokenizer as the npm package
// `tiktoken` ships it (WASM), installed in build/node/ by `make deps` (or NODE_MODULES=...).
//   node tiktoken_peer.cjs files OUT_DIR
//       writes OUT_DIR/{cl100k_base,o200k_base}.tiktoken (standard "<base64> <rank>" lines) from
//       the package's compact encoders/*.json ("! <first rank> tok tok ..." runs of ranks)
//   node tiktoken_peer.cjs encode ENCODING DOCS OUT [special]
//       DOCS: [u32 n_bytes][bytes] per document; OUT: [u32 n_ids][u32 ids] per document, each
//       document encoded alone (special: with allowed_special "all")
//   node tiktoken_peer.cjs pattern ENCODING
//       prints the package's pre-tokenizer pattern, then one "<special token> <id>" per line
//   node tiktoken_peer.cjs bench ENCODING DOCS REPEATS
//       prints "peer_mb_s <MB/s>" (encode only, best of REPEATS passes over all documents)
"use strict";
const fs = require("fs");
const path = require("path");

const modules = process.env.NODE_MODULES || path.join(__dirname, "..", "..", "build", "node", "node_modules");
const pkg = path.join(modules, "tiktoken");

function encoder_json(name) {
    return JSON.parse(fs.readFileSync(path.join(pkg, "encoders", name + ".json"), "utf8"));
}

function write_rank_file(name, out) {
    const parts = encoder_json(name).bpe_ranks.split(" ");
    const lines = [];
    let rank = 0;
    for (let i = 0; i < parts.length; ++i) {
        if (parts[i] === "!") {
            rank = Number.parseInt(parts[++i], 10);
            continue;
        }
        lines.push(parts[i] + " " + rank++);
    }
    fs.writeFileSync(out, lines.join("\n") + "\n");
}

function read_docs(file) {
    const buf = fs.readFileSync(file);
    const docs = [];
    for (let at = 0; at < buf.length;) {
        const n = buf.readUInt32LE(at);
        docs.push(buf.toString("utf8", at + 4, at + 4 + n));
        at += 4 + n;
    }
    return docs;
}

function make_encoder(name) {
    const { Tiktoken } = require(path.join(pkg, "lite", "tiktoken.cjs"));
    const e = encoder_json(name);
    return new Tiktoken(e.bpe_ranks, e.special_tokens, e.pat_str);
}

const [cmd, a, b, c, d] = process.argv.slice(2);
if (cmd === "files") {
    fs.mkdirSync(a, { recursive: true });
    for (const name of ["cl100k_base", "o200k_base"])
        write_rank_file(name, path.join(a, name + ".tiktoken"));
} else if (cmd === "encode") {
    const enc = make_encoder(a);
    const chunks = [];
    for (const doc of read_docs(b)) {
        const ids = d === "special" ? enc.encode(doc, "all") : enc.encode(doc);
        const out = Buffer.alloc(4 + 4 * ids.length);
        out.writeUInt32LE(ids.length, 0);
        for (let i = 0; i < ids.length; ++i)
            out.writeUInt32LE(ids[i], 4 + 4 * i);
        chunks.push(out);
    }
    fs.writeFileSync(c, Buffer.concat(chunks));
    enc.free();
} else if (cmd === "pattern") {
    const e = encoder_json(a);
    console.log(e.pat_str);
    for (const [text, id] of Object.entries(e.special_tokens))
        console.log(text + " " + id);
} else if (cmd === "bench") {
    const enc = make_encoder(a);
    const docs = read_docs(b);
    const bytes = docs.reduce((s, x) => s + Buffer.byteLength(x, "utf8"), 0);
    let best = Infinity;
    for (let r = 0; r < Number.parseInt(c, 10); ++r) {
        const t0 = process.hrtime.bigint();
        for (const doc of docs)
            enc.encode(doc);
        best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
    }
    console.log("peer_mb_s " + (bytes / 1e6 / best).toFixed(3));
    enc.free();
} else {
    console.error("usage: node tiktoken_peer.cjs files OUT_DIR | encode ENC DOCS OUT [special] | pattern ENC | bench ENC DOCS REPEATS");
    process.exit(2);
}
