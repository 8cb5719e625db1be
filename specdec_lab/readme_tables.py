"""The result tables of README.md and of the lab page (notebooks/lab/README.md), rendered from the committed JSON
(never typed).

    python -m specdec_lab.readme_tables            # print every table
    python -m specdec_lab.readme_tables --write    # rewrite both pages' result blocks in place
    python -m specdec_lab.readme_tables --check    # exit 1 if a page's blocks differ from the JSON

A block in either page sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`; everything between
the two markers is this module's output for NAME. Speedups are against `ar` measured in the same run, with
a 95% bootstrap interval over prompts (`report.speedup`); the words "fastest" and "tie" come from
`report.rank` (intervals that overlap are ties).
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from specdec_utils import measure, report
from specdec_utils.utils import REPO_ROOT

from .provenance import earlier_draft_note, recorded_weights, replaced_head, used_earlier_draft

BENCH = REPO_ROOT / "data" / "bench"
MODELS = REPO_ROOT / "data" / "models"
README = REPO_ROOT / "README.md"
LAB = REPO_ROOT / "notebooks" / "lab" / "README.md"   # the lab page: every other result table
PAGES = (README, LAB)


def _load(name: str) -> list | dict:
    return json.loads((BENCH / name).read_text())


def _tok_s(records, method) -> float:
    return report.tokens_per_second(report.select(records, method))


def _device(records) -> str:
    first = records[0]
    name = first.get("device_name", "").split(" | ")[0] or first.get("device", "?")
    return name


def _at(records, temperature: float) -> list[dict]:
    return [r for r in records if float(r.get("temperature", 0.0)) == temperature]


# --------------------------------------------------------------------------- the blocks
BENCH_FILES = [("cpu_avx512bf16_bfloat16.json", "2-core AMD EPYC, AVX-512 BF16, bfloat16"),
               ("cpu_avx512bf16_float32.json", "same CPU, float32"),
               ("cpu_avx2_bfloat16.json", "2-core AMD EPYC, AVX2 only, bfloat16"),
               ("cpu_avx2_float32.json", "same CPU, float32"),
               ("gpu_h100_bfloat16.json", "NVIDIA H100, bfloat16 (eager)"),
               ("gpu_h100_bfloat16_graphed.json", "same GPU, bfloat16, `--cuda-graphs` (ours graphed, HF eager)"),
               ("gpu_h100_float32.json", "same GPU, float32 (eager)")]


EARLIER = " (earlier `draft-m`)"  # a row measured with the draft-m shipped before today's


def _earlier(records) -> str:
    """EARLIER when a run of `draft-m`'s rows recorded the weights it replaced, or none (`earlier_draft_note`)."""
    return EARLIER if used_earlier_draft(recorded_weights(records)) else ""


def _earlier_footer(lines: list[str]) -> str:
    """The sentence under a table with rows marked EARLIER: which draft those runs used."""
    marked = any(EARLIER in line for line in lines)
    return ("\n\n" + earlier_draft_note(f"The runs marked \"{EARLIER.strip()}\"")) if marked else ""


def bench_table() -> str:
    head = ["device, dtype", "`ar` tokens/s", "ours, greedy", "HF assisted", "ours over `ar`", "ours over HF",
            "tau (ours / HF)", "versions, date"]
    lines, garbled = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)], False
    for name, label in BENCH_FILES:
        # ar's speed does not depend on its temperature (some runs drew ar at T = 1); ours and HF's: greedy only
        records = [r for r in _load(name) if r["method"] == "ar" or float(r.get("temperature", 0.0)) == 0.0]
        methods = {r["method"] for r in records}
        hf = "hf-assisted" in methods
        ours = report.speedup(records, "greedy")
        tau_ours, tau_hf = (report.tau(records, m).value if m in methods else None for m in ("greedy", "hf-assisted"))
        cells = [label + _earlier(records), f"{_tok_s(records, 'ar'):.1f}", f"{_tok_s(records, 'greedy'):.1f}",
                 f"{_tok_s(records, 'hf-assisted'):.1f}" if hf else "-", f"{ours:.2fx}",
                 f"{report.speedup(records, 'greedy', 'hf-assisted'):.2fx}" if hf else "-",
                 f"{tau_ours:.2f} / " + (f"{tau_hf:.2f}" if hf else "-"),
                 _versions(records)]
        lines.append("| " + " | ".join(cells) + " |")
        garbled |= hf and tau_hf < tau_ours - 0.005
    return "\n".join(lines) + _earlier_footer(lines) + (HF_FAULT if garbled else "")


# greedy and float32-exact, HF's loop runs our algorithm: a lower tau there means it drafted from another context
HF_FAULT = ("\n\nWhere HF's τ is below ours, the run predates a fix to our draft class, which hid the attention mask "
            "from transformers' `generate` ([notebook 10's lab page](notebooks/lab/10_leaderboard_lab.ipynb)).")


def _versions(records) -> str:
    first = records[0]
    v = first.get("versions")
    text = f"torch {v['torch'].split('+')[0]}, transformers {v['transformers']}" if v else "versions not recorded"
    return text + (f"; {first['date']}" if first.get("date") else "")


POLICY_FILES = [("policies_cpu_avx2_float32.json", "AVX2, float32"),
                ("policies_cpu_avx2_bfloat16.json", "AVX2, bfloat16"),
                ("policies_cpu_avx512bf16_float32.json", "AVX-512 BF16, float32"),
                ("policies_cpu_avx512bf16_bfloat16.json", "AVX-512 BF16, bfloat16")]


def _speedup_grid(files, *, temperature=0.0, label_of=lambda m: f"`{m}`") -> str:
    """Methods as rows, runs as columns: speedup [interval] (waste); the fastest tier of each run in bold."""
    runs = [(_at(_load(name), temperature), label) for name, label in files]
    methods = list(dict.fromkeys(r["method"] for records, _ in runs for r in records))
    estimates = [{m: report.speedup(records, m) for m in methods if m != "ar" and report.select(records, m)}
                 for records, _ in runs]
    best = [set(report.rank(e)[0]) if e else set() for e in estimates]
    lines = ["| method | " + " | ".join(label for _, label in runs) + " |", "|---|" + "---|" * len(runs)]
    for m in methods:
        cells = []
        for (records, _), est, top in zip(runs, estimates, best):
            if m == "ar":
                cells.append(f"1.00x ({_tok_s(records, 'ar'):.1f} tok/s)")
            elif m in est:
                waste = report.waste_per_token(report.select(records, m))
                text = f"{est[m]:.2fx}" + (f" ({waste:.2f})" if waste is not None else "")
                cells.append(f"**{text}**" if m in top else text)
            else:
                cells.append("-")
        lines.append(f"| {label_of(m)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def policies_table() -> str:
    table = _speedup_grid([(name, label + _earlier(_load(name))) for name, label in POLICY_FILES])
    return table + _earlier_footer(table.splitlines()[:1])


def hierarchy_table() -> str:
    name = "hierarchy_cpu_avx512bf16_bfloat16.json"
    records = _load(name)
    greedy, sampled = _at(records, 0.0), [r for r in records if float(r.get("temperature", 0.0)) > 0]
    t = max(float(r["temperature"]) for r in sampled)
    top_p = sampled[0].get("top_p", 1.0)
    methods = list(dict.fromkeys(r["method"] for r in records))
    est = [{m: report.speedup(rs, m) for m in methods if m != "ar"} for rs in (greedy, sampled)]
    best = [set(report.rank(e)[0]) for e in est]
    lines = [f"| method | greedy | sampled (T = {t:g}, top-p {top_p:g}) |", "|---|---|---|"]
    for m in methods:
        if m == "ar":
            cells = [f"1.00x ({_tok_s(rs, 'ar'):.1f} tok/s)" for rs in (greedy, sampled)]
        else:
            cells = [f"**{e[m]:.2fx}**" if m in b else f"{e[m]:.2fx}" for e, b in zip(est, best)]
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _tree_table(name: str) -> str:
    records = _load(name)
    greedy = _at(records, 0.0)
    methods = [m for m in dict.fromkeys(r["method"] for r in greedy) if m != "ar"]
    est = {m: report.speedup(greedy, m) for m in methods}
    top = set(report.rank(est)[0])
    lines = ["| method (greedy) | tau | speedup over `ar` |", "|---|---|---|",
             f"| `ar` | 1.00 | 1.00x ({_tok_s(greedy, 'ar'):.1f} tok/s) |"]
    for m in methods:
        text = f"{est[m]:.2fx}"
        lines.append(f"| `{m}` | {report.tau(greedy, m).value:.2f} | {f'**{text}**' if m in top else text} |")
    return "\n".join(lines)


def trees_table() -> str:
    return _tree_table("trees_cpu_avx512bf16_bfloat16.json")


def trees_gpu_table() -> str:
    return _tree_table("trees_gpu_h100_bfloat16.json")


def engine_gpu_table() -> str:
    data = _load("engine_gpu_h100.json")
    loop = data["loop"]
    modes = list(dict.fromkeys(v["mode"] for v in loop.values()))
    methods = list(dict.fromkeys(v["method"] for v in loop.values()))

    def est(entry, base):
        # per-prompt tokens/s -> tokens/s of the run (equal tokens per prompt), bootstrapped over prompts, paired
        pairs = list(zip(entry["per_prompt_tok_per_s"], base["per_prompt_tok_per_s"]))

        def ratio(sample):
            return (len(sample) / sum(1 / a for a, _ in sample)) / (len(sample) / sum(1 / b for _, b in sample))
        return report.bootstrap(pairs, ratio)
    lines = ["| method | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for m in methods:
        cells = []
        for mode in modes:
            entry, base = loop.get(f"{mode} | {m}"), loop.get(f"{mode} | ar")
            if entry is None:
                cells.append("-")
            elif m == "ar":
                cells.append(f"{entry['tok_per_s']:.1f} tok/s")
            else:
                cells.append(f"{entry['tok_per_s']:.1f} tok/s, {est(entry, base):.2fx}, tau {entry['tau']:.2f}")
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    step = data["step"]
    lines += ["", "| one step (after a 100-token prefix) | eager | CUDA graph | ratio |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['eager_ms']:.2f} ms | {v['graphed_ms']:.2f} ms | {v['speedup']:.1f}x |"
              for k, v in step.items()]
    ident = data["float32_identity"]
    lines += ["", "float32 identity (prompts whose tokens agree): " + "; ".join(
        f"{k}: static = dynamic {v['static_eq_dynamic']}/{v['prompts']}, "
        f"graphed = static {v['graphed_eq_static']}/{v['prompts']}, "
        f"= `ar` {v['eq_ar']}/{v['prompts']}" for k, v in ident.items()) + "."]
    versions = data["versions"]
    return (f"{data['device']}, {data['dtype']}, {len(data['prompts'])} held-out prompts x {data['max_new_tokens']} "
            f"tokens, torch {versions['torch']}, transformers {versions['transformers']}, {data['date']}:\n\n"
            + "\n".join(lines))


def tree_attention_table() -> str:
    data = _load("tree_attention_gpu_h100_bfloat16.json")
    grid = data["grid"]
    kernels = [("sdpa_bool_mask", "SDPA + bool mask"), ("sdpa_no_mask", "SDPA, no mask (floor)"),
               ("flex_block_mask", "FlexAttention"), ("triton_masked", "Triton masked"),
               ("triton_parents", "Triton mask-free")]
    prefixes = sorted({int(k.split("_")[0][1:]) for k in grid})
    lines = []
    for p in prefixes[-1:]:
        lines += [f"| P = {p} | " + " | ".join(label for _, label in kernels) + " |", "|---|" + "---|" * len(kernels)]
        for key in sorted((k for k in grid if k.startswith(f"P{p}_")), key=lambda k: int(k.split("_T")[1])):
            row = grid[key]
            times = {k: row[k]["us"] for k, _ in kernels if k in row and row[k].get("us") is not None}
            fastest = min((v for k, v in times.items() if k != "sdpa_no_mask"), default=None)
            cells = [(f"**{times[k]:.1f} µs**" if times[k] == fastest else f"{times[k]:.1f} µs") if k in times else "-"
                     for k, _ in kernels]
            lines.append(f"| T = {key.split('_T')[1]} | " + " | ".join(cells) + " |")
    return f"{data['device']}, {data['dtype']}, {data['shapes']}; {data['timing']}; " \
           f"torch {data['versions']['torch']}, {data['date']}:\n\n" + "\n".join(lines)


def drafts_table() -> str:
    lines = ["| draft | shape | parameters | per-token greedy agreement | tau at gamma 4 (greedy) "
             "| a = 1 - TV(p, q) at T = 1 | draft measured in | trained on |",
             "|---|---|---|---|---|---|---|---|"]
    for name in ("draft-s", "draft-m"):
        log = json.loads((MODELS / name / "training_log.json").read_text())
        shape, ev = log["shape"], log["eval"]
        before = log.get("continued_from")
        went_on = f", going on from a draft trained on {before['corpus_tokens'] / 1e6:.1f} M tokens" if before else ""
        lines.append(f"| `{name}` | {shape['num_hidden_layers']} layers, width {shape['hidden_size']} | "
                     f"{log['parameters'] / 1e6:.1f} M | {ev['agreement']:.3f} | {ev['tau']:.2f} | "
                     f"{ev['alpha_tv']:.3f} | {ev.get('dtype', 'bfloat16')} ({ev['positions']:,} positions) | "
                     f"{log['device']}, {log['corpus_sequences']:,} sequences "
                     f"({log['corpus_tokens'] / 1e6:.1f} M tokens){went_on} |")
    ev = json.loads((MODELS / "draft-m" / "training_log.json").read_text())["eval"]
    return (f"Held-out: {ev['prompts']} evaluation prompts, teacher-forced on the target's greedy "
            f"{ev['new_tokens']}-token continuations, as each draft's training run computed them on its own GPU (their "
            "lengths, the positions, differ a little).\n\n" + "\n".join(lines))


def heads_table() -> str:
    log = json.loads((MODELS / "medusa-heads" / "training_log.json").read_text())
    ev = log["eval"]
    lines = ["| head (guesses the token k + 1 ahead) | top-1 | top-5 | top-10 | positions |", "|---|---|---|---|---|"]
    for k, (a, b, c, n) in enumerate(zip(ev["top1"], ev["top5"], ev["top10"], ev["positions"]), 1):
        lines.append(f"| head {k} | {a:.3f} | {b:.3f} | {c:.3f} | {n:,} |")
    return (f"Held-out accuracies ({log.get('eval_prompts', 'the')} evaluation prompts, teacher-forced), heads "
            f"trained on {log['device']} from {log['corpus_sequences']:,} target-written sequences "
            f"({log['corpus_tokens'] / 1e6:.2f} M tokens):\n\n"
            + "\n".join(lines))


def ngram_table() -> str:
    ev = json.loads((MODELS / "ngram" / "training_log.json").read_text())["eval"]
    labels = {"with_context": "prompt lookup, then the table", "table_only": "the table alone",
              "context_only": "prompt lookup alone"}
    lines = ["| level | answers at | right when it answers | right overall |", "|---|---|---|---|"]
    lines += [f"| {labels.get(k, k)} | {v['coverage']:.1%} | {v['hit_rate']:.1%} | {v['agreement']:.1%} |"
              for k, v in ev.items() if isinstance(v, dict) and "coverage" in v]
    first = next(v for v in ev.values() if isinstance(v, dict))
    return f"Held-out: {first['prompts']} evaluation prompts, {first['positions']:,} positions of the target's " \
           "greedy continuations.\n\n" \
           + "\n".join(lines)


def leaderboard_table() -> str:
    """One row per committed board: greedy draft-m's speedup, the fastest tier, and outputs equal to ar's."""
    from specdec_utils import leaderboard
    files = leaderboard.committed_files(BENCH)
    lines = ["| board | `greedy` or `sampling` (tau) | fastest, and every method tied with it "
             "| greedy outputs = `ar`'s |", "|---|---|---|---|"]
    for records in leaderboard.load(files):
        first = records[0]
        sampled = any(float(r.get("temperature", 0.0)) > 0 for r in records if r["method"] != "ar")
        parts = first["device_name"].split(" | ")
        capability = len(parts) > 1 and not parts[-1].startswith(("torch", "transformers"))
        device = parts[0] + (f" ({parts[-1]})" if capability else "")
        label = (f"{device}, {first['dtype']}, "
                 f"{'CUDA graphs' if first.get('cuda_graphs') else 'eager'}, {'sampled' if sampled else 'greedy'}")
        methods = [m for m in dict.fromkeys(r["method"] for r in records) if m != "ar"]
        est = {m: report.speedup(records, m) for m in methods}
        top = report.rank(est)[0]
        fastest = ", ".join(f"`{m}` {est[m].value:.2f}x" for m in top)
        chain = "greedy" if "greedy" in est else "sampling"
        ar = {r["id"]: r["new_token_ids"] for r in records if r["method"] == "ar"}
        greedy_methods = [m for m in methods
                          if all(float(r.get("temperature", 0.0)) == 0 for r in report.select(records, m))]
        if sampled or not greedy_methods:
            same = "- (sampled)"
        else:
            counts = [sum(r["new_token_ids"] == ar[r["id"]] for r in report.select(records, m)) for m in greedy_methods]
            n = len(ar)
            same = f"{min(counts)}-{max(counts)} of {n}" if min(counts) != max(counts) \
                else f"{counts[0]} of {n}, every method"
        tau = report.tau(records, chain).value
        lines.append(f"| {label}{_earlier(records)} | `{chain}` {est[chain]:.2fx} ({tau:.2f}) | {fastest} | {same} |")
    return "\n".join(lines) + _earlier_footer(lines)


def runtimes_table() -> str:
    """Each notebook's committed full run: minutes from its cells' execution times, and its stamp's CPU kind."""
    import datetime
    rows = ["| notebook | full run, minutes | executed on |", "|---|---|---|"]
    for path in sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        times = [c["metadata"]["execution"] for c in code if "execution" in c.get("metadata", {})]
        stamp = next(("".join(o.get("text", "")) for c in code for o in c.get("outputs", [])
                      if "run stamp" in "".join(o.get("text", ""))), "")
        kind = re.search(r"CPU kind: ([^(\n]+?) \(", stamp)
        date = re.search(r"run stamp\s+(\d{4}-\d\d-\d\d)", stamp)
        if not times:
            rows.append(f"| `{path.stem}` | not executed | - |")
            continue
        start, end = (datetime.datetime.fromisoformat(t.replace("Z", "+00:00"))
                      for t in (times[0]["iopub.execute_input"], times[-1]["shell.execute_reply"]))
        minutes = (end - start).total_seconds() / 60
        rows.append(f"| `{path.stem}` | {minutes:.1f} | {date.group(1) if date else '?'}, 2-core CPU, "
                    f"{kind.group(1) if kind else 'CPU kind not stamped'} |")
    return "\n".join(rows)


def step_gpu_table() -> str:
    """One target step four ways (step_bench): kernels, ms (median, min-max), against the bandwidth floor."""
    run = _load("step_gpu_h100.json")
    rows = [f"{run['device']}, {run['dtype']}, torch {run['torch']}, transformers {run['transformers']}, "
            f"{run['date']}; cache {run['steps'][0]['cache_len']} tokens, {run['repeats']} runs of {run['iters']} "
            f"steps; bandwidth floor {run['floor_ms']:.3f} ms ({run['weight_bytes'] / 1e6:.0f} MB of weights at "
            f"{run['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s):", "",
            "| one target step | tokens | kernels | ms (median, min-max) |", "|---|---|---|---|"]
    for s in run["steps"]:
        timing = (f"{s['median_ms']:.2f} ({s['min_ms']:.2f}-{s['max_ms']:.2f})" if "error" not in s
                  else f"failed: {s['error'][:80]}")
        rows.append(f"| {s['way']} | {s['tokens']} | {s.get('kernels', '-')} | {timing} |")
    return "\n".join(rows)


def trees_graphed_table() -> str:
    """Every method on the compiled, graphed plain runner (specdec_lab/tree_graph_bench): three runs, speedups over the
    same runner's `ar` (median and min-max over runs; bootstrap over prompts) and over the engine's graphed `ar`."""
    from specdec_utils import report
    run, identity = _load("tree_graph_h100.json"), _load("tree_graph_identity_h100.json")
    records = run["records"]
    runs = sorted({r["repeat"] for r in records})
    methods = list(dict.fromkeys(r["method"] for r in records))

    def of(method, k):
        return [r for r in records if r["method"] == method and r["repeat"] == k]
    same = all(c["same_as_eager"] == identity["prompts"] for c in identity["methods"].values())
    rows = [f"{run['device']}, {run['record_fields_common']['dtype']}, greedy, torch {run['torch']}, transformers "
            f"{run['transformers']}, {run['date']}; {len({r['id'] for r in records})} held-out prompts x "
            f"{run['max_new_tokens']} tokens, {len(runs)} runs. float32 check ({identity['prompts']} prompts): every "
            f"method graphed gives the eager tokens: {'yes' if same else 'NO'}.", "",
            "| method | tok/s (median of runs) | tau | over `ar`, same runner (runs; prompts) "
            "| over the engine's graphed `ar` |",
            "|---|---|---|---|---|"]
    rates = report.rates_by_repeat(records)
    for m in methods:
        rate = report.from_repeats([rates[(m, k)] for k in runs])
        over, prompts = report.over_repeats(records, m, "ar", rates) if m != "ar" else (None, None)
        engine = report.speedup(records, m, "ar (engine)") if m != "ar (engine)" else None
        rows.append(f"| `{m}` | {rate.value:.0f} | {report.tokens_per_target_call(of(m, runs[0])):.2f} | "
                    + ("1.00x" if prompts is None else f"{over:.2fx}; {prompts.low:.2f}-{prompts.high:.2f}") + " | "
                    + ("1.00x" if engine is None else f"{engine:.2fx}") + " |")
    return "\n".join(rows)


def device_loop_table() -> str:
    """The greedy round on the device (core/device_loop.py, specdec_lab/tree_graph_bench --part device-*): the held-out
    board (tokens per second, the median over its repeats; speedups over the device loop's `ar`, the median of the
    repeats' ratios with their min-max and the bootstrap over prompts, and over the engine's graphed `ar`), the GPU
    time of a round, the gammas and the tree's shape tuned on training prompts, and the float32 check."""
    from specdec_utils import report
    run, identity, tune, tree_tune = (_load(f"tree_graph_device{part}_h100.json")
                                      for part in ("", "_identity", "_tune", "_tune_trees"))
    records = run["records"]
    methods = list(dict.fromkeys(r["method"] for r in records))
    repeats = sorted({r["repeat"] for r in records})
    rates = report.rates_by_repeat(records)
    same = all(c == identity["prompts"] for c in identity["methods"].values())
    rows = [f"{run['device']}, bfloat16, greedy, torch {run['torch']}, transformers {run['transformers']}, "
            f"{run['date']}; {run['prompts']} held-out prompts x {run['max_new_tokens']} tokens, {len(repeats)} "
            f"repeats in {len(run['runs'])} runs (tok/s: the median over the repeats; over the device `ar`: the median "
            f"of the repeats' ratios (min-max); then the bootstrap interval over prompts). gamma tuned on training "
            f"prompts ({tune.get('selection', tune['prompts'])}): "
            + ", ".join(f"{m} {g}" for m, g in tune["best"].items())
            + f"; the tree's shape (depth x top-k x nodes) on {tree_tune['prompts']} training prompts "
            f"({', '.join(tree_tune['categories'])}): {tree_tune['best']['eagle (device)']}. float32 check "
            f"({identity['prompts']} held-out prompts): every device loop gives the eager `ar` tokens: "
            f"{'yes' if same else 'NO'}.", "",
            "| loop | gamma or tree | tok/s | tau | over the device `ar`: repeats; prompts "
            "| over the engine's graphed `ar` | GPU ms per round (all / draft / verify) |",
            "|---|---|---|---|---|---|---|"]
    for m in methods:
        mine = [r for r in records if r["method"] == m]
        runs_, over = report.over_repeats(records, m, "ar (device)", rates) if m != "ar (device)" else (None, None)
        engine = report.speedup(records, m, "ar (engine)") if m != "ar (engine)" else None
        parts = run["anatomy"].get(m, {})
        shape = run["tree"] if m == "eagle (device)" else run["gammas"].get(m, 0)
        rows.append(f"| `{m}` | {shape} | {report.from_repeats([rates[(m, k)] for k in repeats]).value:.0f} | "
                    f"{report.tokens_per_target_call(mine):.2f} | "
                    + ("1.00x" if over is None else f"{runs_:.2fx}; {over.low:.2f}-{over.high:.2f}") + " | "
                    + ("1.00x" if engine is None else f"{engine:.2fx}") + " | "
                    + " / ".join(f"{parts[k]:.2f}" if k in parts else "-"
                                 for k in ("round_ms", "draft_ms", "verify_ms"))
                    + " |")
    return "\n".join(rows)


def device_attention_table() -> str:
    """The device loops with the target's attention on SDPA and on notebook 08's Triton kernel, side by side in one run
    (tree_graph_bench --part device-board --attention both), the loops interleaved prompt by prompt: tokens per
    second (median of the repeats), tau, the GPU time of a round and tau per GPU ms, and speedups over `ar` on each
    attention (the repeats' median with min-max; the bootstrap interval over prompts, repeats pooled)."""
    run = _load("tree_graph_device_attention_h100.json")
    records = run["records"]
    methods = list(dict.fromkeys(r["method"] for r in records))
    repeats = sorted({r["repeat"] for r in records})
    rates = report.rates_by_repeat(records)
    rows = [f"{run['device']}, bfloat16, greedy, every device loop compiled whole, torch {run['torch']}, transformers "
            f"{run['transformers']}, {run['date']}; {run['prompts']} held-out prompts x {run['max_new_tokens']} "
            f"tokens, {len(repeats)} repeats, loops interleaved prompt by prompt, buffers of {run['capacity']} slots; "
            f"speedups: the repeats' median (min-max); the 95% bootstrap interval over prompts; note: {run['note']}",
            "",
            "| loop | gamma or tree | tok/s | tau | GPU ms per round | tau per GPU ms | over `ar (device)` (SDPA) "
            "| over `ar (device, triton)` | over `ar (engine)` |", "|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        mine = [r for r in records if r["method"] == m]
        tau = report.tokens_per_target_call(mine)
        gpu = run["anatomy"].get(m, {}).get("round_ms")
        cells = []
        for base in ("ar (device)", "ar (device, triton)", "ar (engine)"):
            if m == base:
                cells.append("1.00x")
                continue
            runs_, over = report.over_repeats(records, m, base, rates)
            cells.append(f"{runs_:.2fx}; {over.low:.2f}-{over.high:.2f}")
        shape = run["tree"] if m.startswith("eagle (") else run["gammas"].get(m, "-")
        rate_ = report.from_repeats([rates[(m, k)] for k in repeats])
        rows.append(f"| `{m}` | {shape} | {rate_.value:.0f} | {tau:.2f} | "
                    + (f"{gpu:.2f} | {tau / gpu:.2f}" if gpu else "- | -") + " | " + " | ".join(cells) + " |")
    return "\n".join(rows)


CPU_DEVICE_BOARDS = (("tree_graph_device_cpu_avx512.json", "greedy, op by op"),
                     ("tree_graph_device_cpu_avx512_round.json", "greedy, each round compiled whole"),
                     ("tree_graph_device_cpu_avx512_round_intel.json", "greedy, each round compiled whole"),
                     ("tree_graph_device_cpu_avx512_sampled.json", "sampled (T = 1), each round compiled whole"))


def device_loop_cpu_table() -> str:
    """The device loops on the CPU (tree_graph_bench --device cpu --part device-board): each committed board's
    loops beside the course's engine measured in the same run, over the engine's `ar` (bootstrap over prompts, the
    word from the interval) and over the device loop's `ar`."""
    from specdec_utils import report
    rows = ["| board | loop | gamma or tree | tok/s | tau | over the engine's `ar` | over the device `ar` |",
            "|---|---|---|---|---|---|---|"]
    heads = []
    for name, how in CPU_DEVICE_BOARDS:
        if not (BENCH / name).exists():
            continue
        run = _load(name)
        records = run["records"]
        label = f"{how}, {run['device'].split(',')[0]}"  # the machine: boards of one CPU kind differ between CPUs
        kind = run["device"].split(",", 1)[1].strip()  # cores and CPU kind
        heads.append(f"{label}: {kind}, bfloat16, torch {run['torch']}, {run['date']}, {run['prompts']} "
                     f"held-out prompts x {run['max_new_tokens']} tokens, one run"
                     + (f", buffers of {run['capacity']} slots" if run.get("capacity") else "")
                     + (f"; note: {run['note']}" if run.get("note") else ""))
        for m in dict.fromkeys(r["method"] for r in records):
            mine = [r for r in records if r["method"] == m]
            engine = report.speedup(records, m, "ar (engine)") if m != "ar (engine)" else None
            device = report.speedup(records, m, "ar (device)") if m != "ar (device)" else None
            shape = run["tree"] if m == "eagle (device)" else run["gammas"].get(m, mine[0].get("gamma", 0))
            rows.append(f"| {label} | `{m}` | {shape} | {report.tokens_per_second(mine):.1f} | "
                        f"{report.tokens_per_target_call(mine):.2f} | "
                        + ("1.00x" if engine is None else f"{engine:.2fx}, {report.verdict(engine)}") + " | "
                        + ("1.00x" if device is None else f"{device:.2fx}") + " |")
    return "\n".join(f"- {head}" for head in heads) + "\n\n" + "\n".join(rows)


def eagle_tau_table() -> str:
    """EAGLE heads' tau by decoding the held-out prompts (eagle_tau), chains and trees: the shipped head's run,
    then the earlier run of the head shipped before it and of a copy trained further on an H200 (its stages in
    data/bench/eagle_stages_h200.json), with the highest tau of each head with its interval."""

    from . import eagle_tau
    stages = _load("eagle_stages_h200.json")
    earlier = f"earlier head (shipped until {replaced_head()[0]['until']})"
    runs = [(_load("eagle_tau_cpu_float32.json"), {"shipped": "shipped"}),
            (_load("eagle_tau_stages_cpu_float32.json"),
             {"shipped": earlier, "stage5": "trained further (stages 4-5 on an H200; not shipped)"})]
    lines = ["| head | training steps | drafting | tau per target pass | tau per drafting round | outputs equal to "
             "`ar`'s | measured on |", "|---|---|---|---|---|---|---|"]
    best = []
    for decoded, label in runs:
        shapes = {s["name"]: s for s in decoded["shapes"]}
        where = f"{decoded['device'].split(',')[0]}, {decoded['date']}"
        for r in measure.decoded_taus(decoded):
            steps = decoded["heads"][r["head"]]["trained_steps"]
            lines.append(f"| {label.get(r['head'], r['head'])} | {steps:,} | "
                         f"{measure.describe_shape(shapes[r['shape']])} | {r['tau']:.2f} | {r['tau_round']:.2f} | "
                         f"{r['same_as_ar']}/{r['prompts']} | {where} |")
        best += [f"{label.get(b['head'], b['head']).split(' (')[0]} {measure.describe_shape(shapes[b['shape']])}: "
                 f"{b['tau_round'].value:.2f} ({b['tau_round'].low:.2f}-{b['tau_round'].high:.2f})"
                 for b in eagle_tau.best_per_head(decoded)]
    decoded = runs[0][0]
    last = stages["stages"][-1]
    board = _load("tree_graph_device_budget_h100.json")
    rates = report.rates_by_repeat(board["records"])
    big, small = "eagle 7x10x60 (device, triton)", "eagle (device, triton)"
    pair = report.over_repeats(board["records"], big, small, rates)
    taus = {m: report.tokens_per_target_call([r for r in board["records"] if r["method"] == m]) for m in (big, small)}
    cost = (f"\n\nWhat the larger tree costs ({board['device']}, bfloat16, notebook 09's device loop compiled whole "
            f"with notebook 08's kernel, {board['prompts']} held-out prompts, {len(board['repeats'])} repeats "
            f"interleaved, the {earlier}; `data/bench/tree_graph_device_budget_h100.json`): tree "
            f"7x10x60 tau {taus[big]:.2f} and {board['anatomy'][big]['round_ms']:.2f} GPU ms per round, tree "
            f"{board['tree']} tau {taus[small]:.2f} and {board['anatomy'][small]['round_ms']:.2f} ms; by wall time the "
            f"larger tree is {pair[0]:.2fx} of the smaller over the repeats, {pair[1]:.2fx} over prompts "
            f"({report.verdict_both(pair)}).")
    return (f"Decoded greedy, {decoded['dtype']}, {len(decoded['prompts'])} held-out prompts x "
            f"{decoded['max_new_tokens']} tokens, on a 2-core CPU (the shipped head's run: {decoded['device']}, torch "
            f"{decoded['torch']}, transformers {decoded['transformers']}). Tree DxWxN: depth D, the W best nodes "
            f"expanded per level, N drafted nodes kept (7x10x60: the nearest shape to EAGLE-2's default budget, "
            f"total_token 60, depth 7, top_k 10 in SafeAILab/EAGLE). The further-trained head's last stage: "
            f"{last['device']}, {last['tokens_seen'] / 1e6:.0f} M token slots in {last['seconds']:.0f} s, "
            f"replayed chain tau {last['eval']['tau_gamma4']:.2f} / {last['eval']['tau_gamma6']:.2f} at gamma "
            f"4 / 6.\n\n"
            + "\n".join(lines) + "\n\nIntervals: 95% bootstrap over prompts; tau per drafting round leaves out the "
            "prefill's pass and its token (the papers' acceptance length). The highest tau per drafting round of each "
            f"head (a chain of at most {eagle_tau.CHAIN_MAX} drafts, and a dynamic tree): " + "; ".join(best) + "."
            + cost)


BLOCKS = {"drafts": drafts_table, "ngram": ngram_table, "heads": heads_table, "bench": bench_table,
          "policies": policies_table, "hierarchy": hierarchy_table, "trees": trees_table, "trees-gpu": trees_gpu_table,
          "engine-gpu": engine_gpu_table, "step-gpu": step_gpu_table, "trees-graphed": trees_graphed_table,
          "device-loop": device_loop_table, "device-loop-cpu": device_loop_cpu_table,
          "device-attention": device_attention_table,
          "tree-attention": tree_attention_table,
          "leaderboard": leaderboard_table, "runtimes": runtimes_table, "eagle-tau": eagle_tau_table}


def render(name: str) -> str:
    return BLOCKS[name]()


BLOCK = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.DOTALL)


def rewrite(text: str) -> str:
    """README text with every results block re-rendered from the JSON."""
    def body(match):
        name = match.group("name")
        if name not in BLOCKS:
            raise SystemExit(f"a page has a results block {name!r}; known blocks: {', '.join(BLOCKS)}")
        return match.group(1) + render(name) + "\n" + match.group(4)
    return BLOCK.sub(body, text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_lab.readme_tables",
                                     description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the pages' result blocks")
    mode.add_argument("--check", action="store_true", help="exit 1 when a page's blocks differ from the JSON")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        for name in BLOCKS:
            print(f"<!-- results:{name} -->\n{render(name)}\n<!-- /results:{name} -->\n")
        return 0
    status = 0
    for page in PAGES:
        where = page.relative_to(REPO_ROOT)
        text = page.read_text()
        new = rewrite(text)
        if args.check:
            stale = [m.group("name") for m, n in zip(BLOCK.finditer(text), BLOCK.finditer(new))
                     if m.group(0) != n.group(0)]
            if stale:
                print(f"{where}'s result blocks differ from the committed JSON: {', '.join(stale)} "
                      f"(run python -m specdec_lab.readme_tables --write)", file=sys.stderr)
                status = 1
            else:
                print(f"{where}'s {len(BLOCK.findall(text))} result blocks match the committed JSON")
            continue
        page.write_text(new)
        print(f"rewrote {len(BLOCK.findall(new))} result blocks in {where}")
    return status


if __name__ == "__main__":
    sys.exit(main())
