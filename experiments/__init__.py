"""The experiments of the five seed papers, run with lossfns.

`python -m experiments NAME [--quick] [--out DIR]` runs one of `EXPERIMENTS`
and writes, under DIR (default `experiments/results/NAME`, or
`.../NAME-quick`), a Markdown table with the paper's numbers beside ours
(`results.md`), every number (`results.json`), plots (`*.png`) and the exact
command (`COMMAND.txt`). Without the corpora under `NLTK_DATA` the data are
sampled from a planted model (`experiments.synthetic`).
"""

EXPERIMENTS = {
    "altun2003": "experiments.altun2003",
    "altun2002": "experiments.altun2002",
    "gao2006": "experiments.gao2006",
    "lavergne2010": "experiments.lavergne2010",
    "smith_eisner2005": "experiments.smith_eisner2005",
    "neural_tagger": "experiments.neural_tagger",
}
