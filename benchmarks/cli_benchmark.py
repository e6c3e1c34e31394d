"""The command line against Wapiti's, each `label` in a fresh process, as a
user runs them: `lossfns label -m MODEL esp.testb OUT` against `wapiti
label -m MODEL esp.testb OUT` on CoNLL-2002 Spanish (issue 44).

One model is trained with each tool on the same 500 esp.train sentences,
with the same pattern file (`examples/ner.pattern`), objective (Wapiti's
defaults: L1 0.5, L2 0.0001) and iteration count; Wapiti's twice, as it
writes models by default (every feature) and compacted (`-c`: only the
features with a non-zero weight, as lossfns' model files keep them). Then
the label step is timed from outside, whole processes (start-up, imports,
reading the model and the input, decoding, writing), interleaved, medians:
lossfns on an empty compilation cache (a new cache folder each time: the
first run on a fresh machine) and on a warm one (every later run), and
Wapiti with each of its models.

The lossfns processes run this checkout (`python -m lossfns` from the
repository root) with their bytecode cached (`PYTHONPYCACHEPREFIX` in the
run's folder, `PYTHONDONTWRITEBYTECODE` dropped), as an installed package
has it. Wapiti is the binary in `$WAPITI`, else `wapiti` on the PATH, else
`/tmp/wapiti/wapiti` (build it from https://github.com/Jekub/Wapiti with
`make`); without one the Wapiti rows are skipped with a note.

    NLTK_DATA=../shared/nltk_data python -m benchmarks --only cli --tag cpu-2core
    WAPITI=/path/to/wapiti python -m benchmarks.cli_benchmark
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TRAIN_SENTENCES = 500
ITERATIONS = 50
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERN = os.path.join(ROOT, "examples", "ner.pattern")
DEFAULT_WAPITI = "/tmp/wapiti/wapiti"


def wapiti_binary() -> str | None:
    """Wapiti's executable: `$WAPITI`, `wapiti` on the PATH, or `/tmp/wapiti/wapiti`; None when none runs."""
    for candidate in (os.environ.get("WAPITI"), shutil.which("wapiti"), DEFAULT_WAPITI):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _sentence_blocks(data: bytes) -> list[bytes]:
    """The sentences of a column file's bytes, each its lines (blank lines between sentences)."""
    blocks = data.replace(b"\r\n", b"\n").split(b"\n\n")
    return [block.strip(b"\n") + b"\n" for block in blocks if block.strip()]


def write_data(directory: str, train_sentences: int) -> tuple[str, str]:
    """`(train, test)`: the first `train_sentences` of esp.train and all of
    esp.testb as plain column files (both tools read the same bytes)."""
    from lossfns import corpora

    paths = []
    for split, count in (("esp.train", train_sentences), ("esp.testb", None)):
        blocks = _sentence_blocks(corpora.read_bytes(corpora.find_data("corpora", "conll2002", split)))
        path = os.path.join(directory, split)
        with open(path, "wb") as file:
            file.write(b"\n".join(blocks[:count]))
        paths.append(path)
    return paths[0], paths[1]


def _environment(directory: str, cache: str) -> dict:
    """A child's environment: its compilation cache, and bytecode cached in the run's folder."""
    environment = dict(os.environ, LOSSFNS_CACHE_DIR=cache, PYTHONPYCACHEPREFIX=os.path.join(directory, "pycache"))
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    return environment


def _timed(command: list, environment: dict | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False, cwd=ROOT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def _scores(path: str) -> dict:
    """Token accuracy and entity F1 of a labelled output: the last column
    predicted, the one before it gold (esp.testb's labels)."""
    from lossfns import metrics

    gold, predicted = [], []
    with open(path, "rb") as file:
        blocks = _sentence_blocks(file.read())
    for block in blocks:
        rows = [line.split() for line in block.decode("utf-8").splitlines()]
        gold.append([row[-2] for row in rows])
        predicted.append([row[-1] for row in rows])
    return {"token_accuracy": metrics.token_accuracy(gold, predicted), "f1": metrics.entity_scores(gold, predicted).f1}


def run(quick: bool = False, log=print, repeats: int = 3) -> dict:
    """Train once with each tool, then time `label` of esp.testb: per round a
    lossfns run on an empty cache, one on the warm cache and Wapiti's, in
    fresh processes; medians over `repeats` rounds (1 when `quick`, with 100
    training sentences and 10 iterations)."""
    repeats = 1 if quick else repeats
    train_sentences, iterations = (100, 10) if quick else (TRAIN_SENTENCES, ITERATIONS)
    wapiti = wapiti_binary()
    note = None
    if wapiti is None:
        note = (
            "Wapiti not found ($WAPITI, `wapiti` on the PATH, /tmp/wapiti/wapiti): its rows are skipped; "
            "build it from https://github.com/Jekub/Wapiti (make) and set WAPITI=/path/to/wapiti"
        )
        log(note)
    with tempfile.TemporaryDirectory() as directory:
        train, test = write_data(directory, train_sentences)
        warm_environment = _environment(directory, os.path.join(directory, "cache"))
        ours_model = os.path.join(directory, "ner.lossfns")
        training = {
            "lossfns": _timed(
                [sys.executable, "-m", "lossfns", "train", "-p", PATTERN, "-i", str(iterations), "--quiet"]
                + [train, ours_model],
                warm_environment,
            )
        }
        log(f"lossfns train: {training['lossfns']:.2f} s")
        if wapiti:
            for name, compact in (("wapiti", []), ("wapiti_compact", ["-c"])):
                training[name] = _timed(
                    [
                        wapiti,
                        "train",
                        *compact,
                        "-p",
                        PATTERN,
                        "-i",
                        str(iterations),
                        train,
                        os.path.join(directory, f"ner.{name}"),
                    ]
                )
                log(f"{name} train: {training[name]:.2f} s")
        label = lambda model, output: ["label", "-m", model, test, os.path.join(directory, output)]
        ours = [sys.executable, "-m", "lossfns", *label(ours_model, "lossfns.txt")]
        _timed(ours, warm_environment)  # the warm cache's programs
        times: dict = {"lossfns_cold": [], "lossfns_warm": []}
        if wapiti:
            times["wapiti"], times["wapiti_compact"] = [], []
        for round_ in range(repeats):
            cold_environment = _environment(directory, os.path.join(directory, f"cold-cache-{round_}"))
            times["lossfns_cold"].append(_timed(ours, cold_environment))
            times["lossfns_warm"].append(_timed(ours, warm_environment))
            for name in ("wapiti", "wapiti_compact") if wapiti else ():
                times[name].append(_timed([wapiti, *label(os.path.join(directory, f"ner.{name}"), f"{name}.txt")]))
            log("label: " + ", ".join(f"{name} {values[-1]:.2f} s" for name, values in times.items()))
        scores = {"lossfns": _scores(os.path.join(directory, "lossfns.txt"))}
        for name in ("wapiti", "wapiti_compact") if wapiti else ():
            scores[name] = _scores(os.path.join(directory, name + ".txt"))
        with open(test, "rb") as file:
            tokens = sum(len(block.splitlines()) for block in _sentence_blocks(file.read()))
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratios = {}
    if wapiti:
        ratios = {
            f"{ours}_over_{peer}": medians[f"lossfns_{ours}"] / medians[peer]
            for ours in ("warm", "cold")
            for peer in ("wapiti", "wapiti_compact")
        }
        log(
            f"label medians: lossfns warm {medians['lossfns_warm']:.2f} s, cold {medians['lossfns_cold']:.2f} s, "
            f"wapiti {medians['wapiti']:.2f} s (compacted model {medians['wapiti_compact']:.2f} s); "
            + ", ".join(f"{name} {ratio:.2f}x" for name, ratio in ratios.items())
        )
    return {
        "train_sentences": train_sentences,
        "iterations": iterations,
        "pattern": os.path.relpath(PATTERN, ROOT),
        "test_tokens": tokens,
        "wapiti": wapiti,
        "note": note,
        "training_s": training,
        "median_s": medians,
        "all_s": times,
        "ratios": ratios,
        "scores": scores,
    }


def markdown(report: dict) -> list:
    medians, ratios, scores = report["median_s"], report["ratios"], report["scores"]
    lines = [
        "## The command line's labelling, each run a fresh process, vs Wapiti",
        "",
        f"`label -m MODEL esp.testb OUT` ({report['test_tokens']} tokens); the models trained on "
        f"{report['train_sentences']} CoNLL-2002 esp.train sentences with `{report['pattern']}`, "
        f"{report['iterations']} iterations of L1 0.5 / L2 0.0001; Wapiti's as it writes them by default "
        "and compacted (`-c`, only non-zero features, as lossfns keeps them). Wall time of the whole "
        "process; medians of interleaved runs; lossfns with its bytecode cached.",
        "",
        "| | s | / Wapiti | / Wapiti, compacted model | token accuracy | entity F1 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = [("lossfns label, warm cache", "lossfns_warm", "warm", "lossfns")]
    rows += [("lossfns label, empty cache", "lossfns_cold", "cold", "lossfns")]
    rows += [
        (f"wapiti label{suffix}", name, None, name) for name, suffix in (("wapiti", ""), ("wapiti_compact", ", -c"))
    ]
    for title, key, ours, tool in rows:
        if key not in medians:
            continue
        factors = [
            f"{ratios[f'{ours}_over_{peer}']:.2f}x" if f"{ours}_over_{peer}" in ratios else "-"
            for peer in ("wapiti", "wapiti_compact")
        ]
        lines.append(
            f"| {title} | {medians[key]:.2f} | {' | '.join(factors)} | {scores[tool]['token_accuracy']:.4f} "
            f"| {scores[tool]['f1']:.4f} |"
        )
    if report.get("note"):
        lines += ["", report["note"]]
    return [*lines, ""]


def main() -> None:
    print(json.dumps(run(quick="--quick" in sys.argv[1:]), indent=2))


if __name__ == "__main__":
    main()
